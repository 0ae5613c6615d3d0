"""A game frame scaled down without losing its small objects.

Bilinear scaling turns a 2-pixel ball into one faint blend that no model tracks, and invents
colours the game never shows. ``scale_frame`` instead picks, in each output cell, the source
pixel whose colour is rarest in the whole frame: backgrounds stay background, a ball or a bullet
survives as one pixel of its own colour, and every output pixel is a colour of the game.
"""

from __future__ import annotations

import numpy as np

_BUCKETS = 65521  # a prime: colour codes spread over its residues


def _cell_starts(source: int, target: int) -> tuple[np.ndarray, np.ndarray]:
    """The first source index of each of ``target`` cells and the cells' sizes (>= 1)."""
    edges = (np.arange(target + 1) * source) // target
    sizes = np.maximum(edges[1:] - edges[:-1], 1)
    return np.minimum(edges[:-1], source - 1), sizes


def _gather_index(source: int, target: int) -> np.ndarray:
    """``(target, k)`` source indices covering each cell (the last index repeated where a cell
    is shorter than ``k``)."""
    starts, sizes = _cell_starts(source, target)
    k = int(sizes.max())
    offsets = np.minimum(np.arange(k)[None, :], sizes[:, None] - 1)
    return starts[:, None] + offsets


def colour_codes(frame: np.ndarray) -> np.ndarray:
    """``(H, W, 3)`` uint8 RGB -> ``(H, W)`` int32 codes ``r << 16 | g << 8 | b``."""
    f = frame.astype(np.int32)
    return (f[..., 0] << 16) | (f[..., 1] << 8) | f[..., 2]


def scale_frame(frame: np.ndarray, size: int) -> np.ndarray:
    """``(H, W, 3)`` uint8 -> ``(size, size, 3)`` uint8, each cell the rarest colour it covers
    (ties: the first in row-major order). ValueError for a non-RGB frame or size < 1."""
    if frame.ndim != 3 or frame.shape[2] != 3 or frame.dtype != np.uint8:
        raise ValueError(f"a frame must be (H, W, 3) uint8, got {frame.shape} {frame.dtype}")
    if size < 1:
        raise ValueError(f"size must be >= 1, got {size}")
    h, w = frame.shape[:2]
    if (h, w) == (size, size):
        return frame.copy()
    # colour counts through a hashed histogram (np.unique sorts and costs 10x more); two
    # colours of one frame sharing a bucket would only merge their counts
    bucket = colour_codes(frame) % _BUCKETS
    rarity = np.bincount(bucket.ravel(), minlength=_BUCKETS)[bucket]
    rows, cols = _gather_index(h, size), _gather_index(w, size)
    # (size, kr, size, kc) rarity of every candidate pixel of every cell
    cand = rarity[rows[:, :, None, None], cols[None, None, :, :]]
    kr, kc = rows.shape[1], cols.shape[1]
    flat = cand.transpose(0, 2, 1, 3).reshape(size, size, kr * kc)
    pick = flat.argmin(axis=2)
    r = np.take_along_axis(np.broadcast_to(rows[:, None, :], (size, size, kr)),
                           (pick // kc)[..., None], axis=2)[..., 0]
    c = np.take_along_axis(np.broadcast_to(cols[None, :, :], (size, size, kc)),
                           (pick % kc)[..., None], axis=2)[..., 0]
    return frame[r, c]


def lost_colours(source: np.ndarray, scaled: np.ndarray) -> int:
    """How many colours of ``source`` no pixel of ``scaled`` shows (0: every object kept at least
    one pixel)."""
    return len(set(np.unique(colour_codes(source))) - set(np.unique(colour_codes(scaled))))
