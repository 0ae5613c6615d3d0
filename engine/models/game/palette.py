"""A game's palette: the colours its frames show, and frames as indices into it.

Game frames scaled by ``engine.worlds.game.frames.scale_frame`` only hold colours the game
draws; an Atari game shows a few dozen. Predicting an index per pixel (cross-entropy) gives
sharp frames in the game's own colours, where a regression would smear an uncertain event into
colours the game never shows.
"""

from __future__ import annotations

import numpy as np

from worldstream.engine.worlds.game.frames import colour_codes


class Palette:
    """``colours``: ``(K, 3)`` uint8, most frequent first."""

    def __init__(self, colours: np.ndarray):
        colours = np.asarray(colours, dtype=np.uint8).reshape(-1, 3)
        if not 2 <= len(colours) <= 256:
            raise ValueError(f"a palette holds 2..256 colours, got {len(colours)}")
        self.colours = colours
        self._codes = colour_codes(colours[None])[0]
        self._order = np.argsort(self._codes)

    def __len__(self) -> int:
        return len(self.colours)

    @classmethod
    def fit(cls, frames: np.ndarray, max_colours: int = 64) -> Palette:
        """The ``max_colours`` most frequent colours of ``(N, H, W, 3)`` uint8 frames (every
        colour when there are fewer)."""
        codes, counts = np.unique(colour_codes(frames).ravel(), return_counts=True)
        keep = codes[np.argsort(-counts, kind="stable")[:max_colours]]
        if len(keep) < 2:  # a blank game still needs two classes to train on
            keep = np.append(keep, (int(keep[0]) + 1) % (1 << 24))
        rgb = np.stack([(keep >> 16) & 255, (keep >> 8) & 255, keep & 255], axis=1)
        return cls(rgb.astype(np.uint8))

    def encode(self, frames: np.ndarray) -> np.ndarray:
        """``(..., H, W, 3)`` uint8 -> ``(..., H, W)`` uint8 indices; a colour outside the
        palette goes to the nearest one (RGB distance)."""
        codes = colour_codes(frames)
        sorted_codes = self._codes[self._order]
        pos = np.clip(np.searchsorted(sorted_codes, codes), 0, len(self) - 1)
        index = self._order[pos]
        missing = sorted_codes[pos] != codes
        if missing.any():
            # distances per distinct missing colour, not per pixel: a game with many colours
            # (crafter's textures) misses millions of pixels but only thousands of colours
            unseen, inverse = np.unique(codes[missing], return_inverse=True)
            rgb = np.stack([(unseen >> 16) & 255, (unseen >> 8) & 255, unseen & 255], 1)
            dist = ((rgb[:, None, :].astype(np.int32)
                     - self.colours[None].astype(np.int32)) ** 2).sum(-1)
            index[missing] = dist.argmin(1)[inverse.ravel()]
        return index.astype(np.uint8)

    def decode(self, index: np.ndarray) -> np.ndarray:
        """``(..., H, W)`` indices -> ``(..., H, W, 3)`` uint8 RGB."""
        return self.colours[index]
