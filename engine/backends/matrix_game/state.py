"""A Matrix-Game 2.0 session's state (:class:`MatrixGameState`), apart from the backend so that
the save state builds one without importing it."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from worldstream.engine.backends.runner import RunnerState
from worldstream.engine.models.wan.vae_stream import WanDecodeCache


@dataclass
class MatrixGameState(RunnerState):
    """One session's (or branch's) state: the shared ones (``text``: the projected image
    tokens ``(257, dim)``), the picture's condition ``(20, cond_frames, h, w)`` and the VAE
    decoder's causal cache."""

    cond: torch.Tensor | None = None
    decode: WanDecodeCache = field(default_factory=WanDecodeCache)
