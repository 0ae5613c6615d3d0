"""Restoring a session that lived elsewhere (a recache): checking the recent frames and held
keys it arrives with, and feeding them to its new backend state as context, in whole chunks."""

from __future__ import annotations

from typing import Any

import numpy as np

from worldstream.engine.core.backend import Finishes, Observes, WorldBackend


def check_history(backend: WorldBackend, history: tuple[np.ndarray, list[frozenset[str]]]
                  ) -> tuple[np.ndarray, list[int]]:
    """``history``'s frames with the backend's action for each set of held keys. Raises
    ValueError unless the frames are ``(n, H, W, 3)`` uint8 with one set of keys each (or a key
    is unknown to the backend)."""
    frames, keys = history
    shape = (backend.height, backend.width, 3)
    if (not isinstance(frames, np.ndarray) or frames.dtype != np.uint8
            or frames.shape[1:] != shape or len(keys) != len(frames)):
        raise ValueError(f"history must be (n, {shape}) uint8 frames with one set of "
                         "held keys each")
    return frames, [backend.key_action(k) for k in keys]  # ValueError


def observe_history(backend: WorldBackend, state: Any, frames: np.ndarray,
                    actions: list[int]) -> None:
    """Feed recent frames to a new session's state as context (whole chunks, the newest
    kept); backends that do not observe (:class:`Observes`) start from their prompt and seed
    alone."""
    n = backend.chunk_frames
    usable = len(frames) - len(frames) % n
    if not isinstance(backend, Observes) or usable == 0:
        return
    frames, actions = frames[-usable:], list(actions)[-usable:]
    for i in range(0, usable, n):
        backend.observe(state, frames[i:i + n], actions[i:i + n])
    if isinstance(backend, Finishes):
        backend.finish()
