"""Clips of recorded play for training a game world: palette indices and actions in RAM.

A clip is ``context + unroll`` consecutive frames of one episode with the actions between
them: the first ``context`` frames are the model's context, each later frame a target.
"""

from __future__ import annotations

import numpy as np
import torch

from worldstream.engine.models.game.palette import Palette
from worldstream.engine.worlds.game.dataset import Episodes


class ClipSampler:
    """Uniform random clips of ``length`` frames from ``episodes`` (encoded once with
    ``palette``). ValueError when no episode is long enough."""

    def __init__(self, episodes: Episodes, palette: Palette, length: int,
                 rng: np.random.Generator):
        self.index = np.concatenate([palette.encode(episodes.frames[i:i + 4096])
                                     for i in range(0, len(episodes), 4096)])
        self.actions = episodes.actions.astype(np.int64)
        self.length = length
        starts = []
        for a, b in zip(episodes.starts[:-1], episodes.starts[1:], strict=True):
            # frames a..b-1; a clip needs the actions of its first length-1 frames
            if b - a >= length:
                starts.append(np.arange(a, b - length + 1))
        if not starts:
            raise ValueError(f"no episode holds {length} frames")
        self.starts = np.concatenate(starts)
        self.rng = rng

    def __len__(self) -> int:
        return len(self.starts)

    def sample(self, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``frames`` ``(B, length, H, W)`` long indices, ``actions`` ``(B, length - 1)``
        long (the action after each frame but the last)."""
        pick = self.starts[self.rng.integers(0, len(self.starts), batch)]
        rows = pick[:, None] + np.arange(self.length)[None]
        frames = torch.from_numpy(self.index[rows].astype(np.int64))
        actions = torch.from_numpy(self.actions[rows[:, :-1]])
        return frames, actions
