"""What the built-in family keeps per stream (:class:`BuiltinState`) and per retained chunk
(:class:`ChunkRecord`), and what memory showed a chunk's frames (:class:`MemoryViews`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

import numpy as np
import torch

from worldstream.engine.backends.runner import RunnerState
from worldstream.engine.core.saved import Saved
from worldstream.engine.models.builtin.spatial_memory import SpatialMemory, UndoRecord

#: a chunk's model-space latents as saved: (F, C, S, S) float32
_LATENT = Saved(("F", "C", "S", "S"), "<f4", limit=1e6)
#: a mean colour (RGB levels) as saved
_COLOUR = Saved((3,), "<f8", limit=1e3)
#: a world position (px) or pose as saved: far inside int64 once floored
_WORLD = 2.0**40


@dataclass
class ChunkRecord:
    """What a retained chunk was computed from (for recache, rewind and save points)."""

    # NOTE: Saved(...): how each field is saved (its save point's arrays are checked against
    # these declarations, engine.core.saved); S: the latent side, h = w
    latents: Annotated[torch.Tensor, _LATENT] | None  # (F, C, h, w) model-space clean latents
    # (F, C, h, w) model-space memory bases as fed (context noise included)
    base: Annotated[torch.Tensor, _LATENT]
    # (F, 2, h, w) current/stale fractions of the bases
    known: Annotated[torch.Tensor, Saved(("F", 2, "S", "S"), "<f4")]
    actions: list[int]
    position: int  # time index of its first frame
    # (F, 2) int64 camera windows' top-left corners, world px
    origins: Annotated[np.ndarray, Saved(("F", 2), "<i8", limit=_WORLD)]
    # (position, velocity) after its last frame
    camera: Annotated[tuple[np.ndarray, torch.Tensor], Saved((2,), "<f8", "cam_pos", _WORLD),
                      Saved((2,), "<f4", "cam_vel", 1e6)]
    # (F, C, h, w) what the cache fill consumed
    context: Annotated[torch.Tensor, _LATENT] | None = None
    undo: list[UndoRecord] = field(default_factory=list)  # memory writes, oldest first
    guided: bool = False  # denoised with classifier-free guidance on the prompt
    # NOTE: (F,) int64 and int: the save-point format's fields of the retired noise-field
    # clock (60fcd8b), kept at zero so that files keep their layout
    field_times: Annotated[np.ndarray, Saved(("*",), "<i8")] = field(
        default_factory=lambda: np.zeros(0, np.int64))
    rest_run: int = 0
    # (2,) rig pose after it
    pose: Annotated[np.ndarray, Saved((2,), "<f8", limit=_WORLD)] = field(
        default_factory=lambda: np.zeros(2))
    # (F, C, h, w) model-space latents of the second skip source (each frame's memory picture
    # warped to its pose), as fed: a model with ``skip_source``; None otherwise
    skip: Annotated[torch.Tensor, _LATENT] | None = None
    # (F, 2) float64 the rig's pose at each frame, or None
    poses: Annotated[np.ndarray, Saved(("F", 2), "<f8", limit=_WORLD)] | None = None
    # (3,) float64 the colour anchor's running mean colour (RGB levels) of generated ground
    # after its last frame, and the reference it was kept against (None where there is none)
    colour_mean: Annotated[np.ndarray, _COLOUR] | None = None
    colour_reference: Annotated[np.ndarray, _COLOUR] | None = None

    @property
    def num_frames(self) -> int:
        return len(self.actions)


@dataclass
class MemoryViews:
    """What memory showed the frames of a chunk being generated, flattened over the batch:
    ``pictures (N, H, W, 3)`` uint8, ``current (N, H, W)`` bool (remembered content of the
    current prompt), ``refining (N, H, W)`` bool (current pixels the frame still rewrites),
    ``base (N, C, h, w)`` their clean model-space latents, ``keys`` their content hashes."""

    pictures: np.ndarray
    current: np.ndarray
    base: torch.Tensor
    keys: list[bytes]
    refining: np.ndarray


@dataclass
class BuiltinState(RunnerState):
    """One session's (or branch's) state: the shared ones plus the spatial memory (what it
    has shown, in world coordinates), pending start frames, the prompt-switch countdowns and
    the references the detail limit and the colour anchor hold generated ground to."""

    memory: SpatialMemory = field(default_factory=SpatialMemory)
    # (F, H, W, 3) uint8, pending prefill
    start_frames: Annotated[np.ndarray, Saved(("F", "H", "W", 3), "|u1")] | None = None
    restyle_left: int = 0  # chunks that still start a new memory epoch (after a prompt switch)
    guide_left: int = 0  # chunks still denoised with prompt guidance (after a prompt switch)
    noise_seed: int = 0  # the world-anchored noise field's seed (forks read the same world)
    # RMS (levels) of what the autoencoder loses on the stream's last real frames (or those a
    # stream of the new prompt would start from); None when the detail limit is off
    detail_reference: float | None = None
    # (3,) float64 colour (RGB levels) the colour anchor holds generated ground near; None
    # when the anchor is off
    colour_reference: np.ndarray | None = None
    # the prompt whose scene the colour prior reads (after a blended switch, its heavier part)
    reference_prompt: str = ""

    @property
    def camera(self) -> tuple[np.ndarray, torch.Tensor]:
        """(position ``(2,)`` float64 world px, velocity ``(2,)`` float32 px/frame) now."""
        if not self.history:
            # NOTE: half a pixel, so that a frame's window (the floor of the position) is the
            # nearest pixel of the path: from 0.0 the first frame after a key did not move
            return np.full(2, 0.5), torch.zeros(2)
        return self.history[-1].camera

    def pose(self, rest: np.ndarray) -> np.ndarray:
        """The rig's pose ``(2,)`` now (``rest`` before any chunk)."""
        return self.history[-1].pose if self.history else rest
