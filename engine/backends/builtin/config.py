"""The built-in family's streaming settings, one documented line per field.

Each world's values are data beside its weights (``assets/<world>/stream_config.json``, read
by :mod:`engine.backends.settings`); why each value is what it is lives in the world's model
card.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import torch
from annotated_types import Interval

from worldstream.engine.backends.stream_config import StreamConfig
from worldstream.engine.core.limits import MAX_STEPS
from worldstream.engine.core.reader import Check
from worldstream.engine.models.builtin.colour_prior import ColourPrior
from worldstream.engine.models.device import MAX_CPU_THREADS, device_problem


@dataclass
class BuiltinConfig(StreamConfig):
    """Streaming settings of the built-in model (the shared ones: :class:`StreamConfig`)."""

    topk_pages: Annotated[int, Interval(ge=0, le=4096)] = 0
    """Older KV pages attended per query chunk, picked by key similarity (0 = off)."""
    spatial_pages: Annotated[int, Interval(ge=0, le=4096)] = 0
    """Older KV pages attended per query chunk, picked by camera overlap with the view
    (0 = off)."""
    memory_tiles: Annotated[int, Interval(ge=1, le=65536)] = 256
    """Spatial-memory tiles (64 px a side) kept per stream, least recently used dropped, >= 1."""
    memory_settle_px: Annotated[int, Interval(ge=1, le=1024)] = 24
    """Pixels inside a frame's border a generated pixel must have been seen before it is final
    in memory, >= 1."""
    pixel_residual: bool = True
    """Show remembered pixels plus the model's change to them where memory holds current
    content, instead of the decode."""
    residual_deadzone: Annotated[float, Interval(ge=0.0, lt=255.0)] = 0.0
    """Soft threshold (levels of 255, in [0, 255)) on the model's change to remembered pixels
    (0 = off)."""
    residual_gate: tuple[float, float] | None = None
    """``(t1, t2)`` levels: where the change exceeds t1 the frame fades to the model's own
    decode, fully at t2 (None = off)."""
    window_pose_tolerance: Annotated[float, Interval(ge=0.0, le=1e6)] | None = None
    """Window frames whose rig pose differs from the new chunk's by more than this (pose
    units) are left out of its attention (None = off)."""
    world_noise: bool = True
    """Read each frame's initial noise from a Gaussian field fixed in world coordinates
    instead of fresh noise."""
    restyle_chunks: Annotated[int, Interval(ge=1, le=10_000)] = 3
    """Chunks after a prompt switch that each start a new memory epoch, >= 1."""
    guidance: Annotated[float, Interval(ge=0.0, le=100.0)] = 2.0
    """Classifier-free guidance scale on the prompt after a switch (1 = off), >= 0."""
    guidance_chunks: Annotated[int, Interval(ge=0, le=10**9)] | None = 30
    """Chunks guided from a prompt switch (None: every chunk), >= 0."""
    steady_guidance_sigma: Annotated[float, Interval(gt=0.0, le=1.0)] | None = 0.6
    """Outside those chunks, guide the prompt at the steps whose σ is at least this, in
    (0, 1] (None = off)."""
    last_step_cache_sigma: Annotated[float, Interval(ge=0.0, lt=1.0)] | None = 0.3
    """:class:`StreamConfig`'s, at the built-in recipe's largest context noise."""
    first_step_from_memory: Annotated[int, Interval(ge=2, le=MAX_STEPS)] | None = 4
    """In chunks of at least this many steps (>= 2), the memory base stands in for the first
    step's prediction (None = off)."""
    refining_detail_cap: Annotated[float, Interval(gt=0.0, le=1e3)] | None = 2.0
    """Remembered detail carried onto ground still being refined is limited to this many
    times the autoencoder's loss on the stream's real frames, > 0 (None = off)."""
    refining_detail_shading: bool = True
    """That detail keeps only its shading of the decoded colour under it."""
    colour_anchor: Annotated[float, Interval(ge=0.0, le=1e6)] | None = 2.0
    """Tolerance (levels, >= 0) around the reference colour that generated ground's running
    mean colour is held within (None = off)."""
    colour_prior: ColourPrior | None = None
    """Per-scene mean colours the colour reference is shrunk toward (None: the frames' own)."""
    action_guidance: Annotated[float, Interval(ge=0.0, le=100.0)] = 1.0
    """Classifier-free guidance scale on the action against ``neutral_action`` (1 = off),
    >= 0."""
    neutral_action: Annotated[int, Interval(ge=0, lt=2**16)] | None = None
    """The world's action id for no key, no expression, silence (needed by action
    guidance)."""
    kept_factors: tuple[int, ...] = ()
    """Factors of a factored action id the negative condition keeps as asked."""
    dtype: torch.dtype = torch.float32
    """Compute dtype of the world model and the KV pool."""
    autoencoder_dtype: torch.dtype | None = None
    """The autoencoder's compute dtype (None: bf16 where the hardware has it, else dtype)."""
    device: Annotated[str, Check(device_problem)] = "cpu"
    """torch device of the model and the KV pool."""
    cpu_threads: Annotated[int, Interval(ge=1, le=MAX_CPU_THREADS)] | None = 1
    """torch intra-op threads on a CPU (process-wide; None = leave as is)."""
    compile: bool = False
    """Run the world model through ``torch.compile`` (warm-up at construction; eager where
    it fails)."""

    def __post_init__(self):
        super().__post_init__()
        if self.topk_pages < 0 or self.spatial_pages < 0:
            raise ValueError("topk_pages and spatial_pages must be >= 0")
        if self.memory_tiles < 1 or self.restyle_chunks < 1 or self.memory_settle_px < 1:
            raise ValueError("memory_tiles, memory_settle_px and restyle_chunks must be >= 1")
        if self.guidance < 0 or (self.guidance_chunks is not None and self.guidance_chunks < 0):
            raise ValueError("guidance and guidance_chunks must be >= 0")
        if self.steady_guidance_sigma is not None and not 0 < self.steady_guidance_sigma <= 1:
            raise ValueError("steady_guidance_sigma must be in (0, 1] or None, got "
                             f"{self.steady_guidance_sigma}")
        if self.action_guidance < 0:
            raise ValueError("action_guidance must be >= 0")
        if self.colour_anchor is not None and not self.colour_anchor >= 0:
            raise ValueError(f"colour_anchor must be >= 0 levels or None, got "
                             f"{self.colour_anchor}")
        if self.refining_detail_cap is not None and not self.refining_detail_cap > 0:
            raise ValueError("refining_detail_cap must be > 0 or None, got "
                             f"{self.refining_detail_cap}")
        if self.first_step_from_memory is not None and self.first_step_from_memory < 2:
            raise ValueError("first_step_from_memory must be >= 2 steps or None, got "
                             f"{self.first_step_from_memory}")
        gate = self.residual_gate
        if gate is not None and not (len(gate) == 2 and 0 <= gate[0] < gate[1]):
            raise ValueError(f"residual_gate must be (t1, t2) levels with 0 <= t1 < t2, got "
                             f"{gate}")
        if self.window_pose_tolerance is not None and self.window_pose_tolerance < 0:
            raise ValueError("window_pose_tolerance must be >= 0 or None, got "
                             f"{self.window_pose_tolerance}")
        if not 0 <= self.residual_deadzone < 255:
            raise ValueError(f"residual_deadzone must be in [0, 255), got {self.residual_deadzone}")
        if self.action_guidance != 1 and self.neutral_action is None:
            raise ValueError("action_guidance needs the world's neutral_action id")
