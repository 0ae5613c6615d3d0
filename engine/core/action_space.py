"""A model family's action space, as the engine core sees it: the keys a model takes (held keys
become a multi-hot vector over them) and whether it takes mouse motion (pointer deltas summed
between chunks, spread over the chunk's frames and scaled to the model's units).

A backend that declares ``action_space`` (an :class:`ActionSpace`) gets per-frame action
vectors in ``ChunkJob.controls``; every other backend keeps its one action id per frame
(``key_action``). Nothing here imports torch: the vectors are tuples of floats, and what each
entry means to the model (which key is which input, which axis is pitch) is the backend's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from worldstream.engine.core.limits import MAX_POINTER_DELTA

#: a frame's action vector: one entry per key of the space (1.0 held, 0.0 not), then the
#: pointer's ``(x, y)`` in model units when the space takes mouse input
FrameControls = tuple[float, ...]


def check_pointer(pointer: Any) -> tuple[float, float]:
    """``(dx, dy)`` of a pointer delta (CSS pixels: x right, y down); ValueError (one line
    naming ``pointer``) for anything but two finite numbers within ``MAX_POINTER_DELTA``."""
    if not isinstance(pointer, tuple | list) or len(pointer) != 2:
        raise ValueError(f"pointer must be [dx, dy], got {pointer!r}")
    values = []
    for value in pointer:
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(
                value):
            raise ValueError(f"pointer values must be finite numbers, got {pointer!r}")
        if abs(value) > MAX_POINTER_DELTA:
            raise ValueError(f"pointer delta {value!r} exceeds the limit of "
                             f"{MAX_POINTER_DELTA:g} pixels per message")
        values.append(float(value))
    return values[0], values[1]


@dataclass(frozen=True)
class ActionSpace:
    """What a model's actions are made of (checked in :meth:`__post_init__`).

    Args:
        keys: the wire key names the model takes, in the order of the multi-hot vector (each
            ``[a-z0-9_]{1,32}``, unique, at least one).
        mouse: whether the model takes mouse motion (the page captures the pointer only then).
        mouse_scale: ``(x, y)`` model units per pixel of pointer motion (signs included: a
            model whose "up" is positive gives y a negative scale).
        mouse_limit: the largest magnitude of a frame's pointer entry, model units (> 0): a
            fast flick saturates instead of leaving the range the model was trained on.
    """

    keys: tuple[str, ...]
    mouse: bool = False
    mouse_scale: tuple[float, float] = (1.0, 1.0)
    mouse_limit: float = math.inf

    def __post_init__(self) -> None:
        if not self.keys or len(set(self.keys)) != len(self.keys):
            raise ValueError(f"keys must be unique and not empty, got {self.keys!r}")
        if not self.mouse_limit > 0:
            raise ValueError(f"mouse_limit must be > 0, got {self.mouse_limit!r}")
        if len(self.mouse_scale) != 2 or not all(math.isfinite(s) for s in self.mouse_scale):
            raise ValueError(f"mouse_scale must be two finite numbers, got {self.mouse_scale!r}")

    @property
    def size(self) -> int:
        """Entries of one frame's vector."""
        return len(self.keys) + (2 if self.mouse else 0)

    def multi_hot(self, keys: frozenset[str]) -> tuple[float, ...]:
        """1.0 for each held key of the space, in its order; ValueError naming a key the
        space lacks."""
        unknown = set(keys) - set(self.keys)
        if unknown:
            raise ValueError(f"unknown key(s) {sorted(map(str, unknown))}; this model takes "
                             f"{list(self.keys)}")
        return tuple(1.0 if k in keys else 0.0 for k in self.keys)

    def frame_controls(self, keys: frozenset[str], pointer: tuple[float, float],
                       num_frames: int) -> list[FrameControls]:
        """The vectors of a chunk of ``num_frames`` frames: the held ``keys`` on every frame
        and the pointer motion ``(dx, dy)`` (pixels, summed since the last chunk) spread
        evenly over the frames, scaled by ``mouse_scale`` and clipped to ``mouse_limit``.
        ValueError for an unknown key or a frame count below 1."""
        if num_frames < 1:
            raise ValueError(f"a chunk needs at least one frame, got {num_frames}")
        hot = self.multi_hot(keys)
        if not self.mouse:
            return [hot] * num_frames
        # NOTE: spread evenly, not binned by arrival time: a chunk's frames are generated at
        # once, after every delta it gets has arrived, so their arrival order carries nothing
        moved = tuple(max(-self.mouse_limit, min(self.mouse_limit, d * s / num_frames))
                      for d, s in zip(pointer, self.mouse_scale))
        return [hot + moved] * num_frames
