"""Spatial memory: what a stream has generated, kept in world coordinates.

The built-in world is a plane seen from above by a translating camera, so a generated frame is a
window onto one large picture. :class:`SpatialMemory` keeps that picture as a sparse canvas of
pixel tiles (the spatial pages of the memory) keyed by world position. Each frame's *base* is
read from it once, at the camera position the model predicts, with integer pixel offsets: no
resampling, so content never degrades by being shifted again and again, and a place the camera
returns to reads back exactly what was written there. The large-model versions of the idea:
WorldMem (pose-keyed memory frames), Context-as-Memory (field-of-view retrieval),
Matrix-Game 3.5 (patch memory).

Every pixel carries the *epoch* it was written in; a prompt switch starts a new epoch, so what
was remembered under the old prompt becomes *stale*: it is still shown to the model (which
restyles it) and is overwritten by the restyled frame. Within an epoch a pixel keeps its *best
view*: it is overwritten only by a frame that sees it farther from the frame's border than any
frame before (capped at ``settle_px``), as image mosaicking prefers central pixels. New ground
always enters at the border, where a decoded frame is least accurate (convolution padding);
writing it once there piled those border columns up into stripes, while rewriting it as it moves
inward settles each pixel after a few frames, after which the model's copies of it never pile
up. View-anchored content (the player sprite at the centre of the frame) is never written.

Forks share tiles copy-on-write; every write returns an undo record, so a rewind restores what
the rewound chunks overwrote.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

import numpy as np

from worldstream.engine.core.saved import Saved

UNKNOWN = -1  # epoch of a pixel never written
#: how far inside a frame (px) a generated pixel is final by default: the training replay's
#: distance (a stream may settle farther in: ``BuiltinConfig.memory_settle_px``)
SETTLE_PX = 16


@dataclass
class _Tile:
    # how each is saved (engine.core.saved), T: the tile side
    rgb: Annotated[np.ndarray, Saved(("T", "T", 3), "|u1")]  # (T, T, 3) uint8
    # (T, T) int32, UNKNOWN where never written
    epoch: Annotated[np.ndarray, Saved(("T", "T"), "<i4")]
    # (T, T) int16 distance (px) to the border of the frame it came from
    view: Annotated[np.ndarray, Saved(("T", "T"), "<i2")]


@dataclass
class MemoryRead:
    """A window read from memory: ``rgb (S, S, 3)`` uint8 (0 where unknown), ``current`` and
    ``stale`` ``(S, S)`` bool masks (written in this epoch / in an earlier one), and
    ``refining (S, S)`` bool: current pixels a frame at this window would rewrite (it sees them
    farther from its border than any frame before: new ground not yet settled)."""

    rgb: np.ndarray
    current: np.ndarray
    stale: np.ndarray
    refining: np.ndarray


@dataclass
class UndoRecord:
    """What one write replaced: per tile, the rectangle's old pixels, epochs and views."""

    parts: list[tuple] = field(default_factory=list)


class SpatialMemory:
    """Sparse pixel canvas in world coordinates, tiled in ``tile × tile`` pages.

    Args:
        tile: tile side, pixels.
        max_tiles: tiles kept; beyond it the least recently used tile is forgotten (the camera
            can wander without bound; 256 tiles of 64 px = 4.2 MB, a 1 × 1 kilopixel area).
        settle_px: a pixel seen at least this far from a frame's border is final for the epoch.
    Coordinates are integer world pixels ``(x, y)`` of a window's top-left corner; ``x`` grows
    to the right, ``y`` downwards (image convention).
    """

    def __init__(self, tile: int = 64, max_tiles: int = 256, settle_px: int = SETTLE_PX):
        if tile < 1 or max_tiles < 1 or settle_px < 1:
            raise ValueError("tile, max_tiles and settle_px must be >= 1")
        self.tile, self.max_tiles, self.settle_px = tile, max_tiles, settle_px
        self._views: dict[int, np.ndarray] = {}  # frame size -> border distance map
        self.epoch = 0
        self._tiles: dict[tuple[int, int], _Tile] = {}
        self._owned: set[tuple[int, int]] = set()  # tiles this memory may write in place
        self._used: dict[tuple[int, int], int] = {}  # tile -> last access tick (LRU)
        self._tick = 0

    # -- reading --------------------------------------------------------------------------
    def _spans(self, x0: int, y0: int, w: int, h: int):
        """(tile key, tile-local slices, window-local slices) covering the window."""
        t = self.tile
        for ty in range(y0 // t, (y0 + h - 1) // t + 1):
            ya, yb = max(y0, ty * t), min(y0 + h, (ty + 1) * t)
            for tx in range(x0 // t, (x0 + w - 1) // t + 1):
                xa, xb = max(x0, tx * t), min(x0 + w, (tx + 1) * t)
                yield (
                    (tx, ty),
                    (slice(ya - ty * t, yb - ty * t), slice(xa - tx * t, xb - tx * t)),
                    (slice(ya - y0, yb - y0), slice(xa - x0, xb - x0)),
                )

    def read(self, x0: int, y0: int, size: int) -> MemoryRead:
        """The ``size × size`` window with top-left corner at world ``(x0, y0)``."""
        rgb = np.zeros((size, size, 3), np.uint8)
        epoch = np.full((size, size), UNKNOWN, np.int32)
        view = np.zeros((size, size), np.int16)
        self._tick += 1
        for key, local, window in self._spans(int(x0), int(y0), size, size):
            tile = self._tiles.get(key)
            if tile is None:
                continue
            self._used[key] = self._tick
            rgb[window] = tile.rgb[local]
            epoch[window] = tile.epoch[local]
            view[window] = tile.view[local]
        current = epoch == self.epoch
        refining = current & (view < self._view(size))  # what write() would overwrite
        return MemoryRead(rgb, current, (epoch != UNKNOWN) & ~current, refining)

    # -- writing --------------------------------------------------------------------------
    def _writable(self, key: tuple[int, int]) -> _Tile:
        tile = self._tiles.get(key)
        if tile is None:
            t = self.tile
            tile = _Tile(
                np.zeros((t, t, 3), np.uint8),
                np.full((t, t), UNKNOWN, np.int32),
                np.zeros((t, t), np.int16),
            )
        elif key not in self._owned:  # shared with a fork: copy before writing
            tile = _Tile(tile.rgb.copy(), tile.epoch.copy(), tile.view.copy())
        self._tiles[key] = tile
        self._owned.add(key)
        self._used[key] = self._tick
        return tile

    def _view(self, size: int) -> np.ndarray:
        """``(size, size)`` int16 distance of each pixel to the frame border, capped."""
        view = self._views.get(size)
        if view is None:
            d = np.minimum(np.arange(size), np.arange(size)[::-1])
            view = np.minimum(np.minimum(d[:, None], d[None, :]) + 1, self.settle_px)
            view = self._views[size] = view.astype(np.int16)
        return view

    def write(self, x0: int, y0: int, rgb: np.ndarray, exclude: np.ndarray | None = None,
              settled: bool = False):
        """Write the frame ``rgb (S, S, 3)`` uint8 at world ``(x0, y0)`` where memory holds
        nothing of the current epoch or only a view closer to a frame border than this one,
        except where ``exclude (S, S)`` is True. ``settled``: the frame is exact up to its
        border (a real frame: a stream's start picture, an observed frame), so it writes every
        pixel (a later real frame is the newer truth) and what it writes is final for the
        epoch against generated frames, as if seen ``settle_px`` from the border. Returns an
        :class:`UndoRecord` for :meth:`undo`. ValueError on a non-square frame."""
        if rgb.ndim != 3 or rgb.shape[0] != rgb.shape[1] or rgb.shape[2] != 3:
            raise ValueError(f"expected a (S, S, 3) frame, got {rgb.shape}")
        size = rgb.shape[0]
        # NOTE: the best-view rule exists because a *decoded* frame is least accurate at its
        # border; a real frame is not, so generated frames must not refine its edges with the
        # model's guesses. Among real frames the newest wins (its water has moved since)
        view = np.full((size, size), self.settle_px, np.int16) if settled else self._view(size)
        undo = UndoRecord()
        self._tick += 1
        for key, local, window in self._spans(int(x0), int(y0), size, size):
            tile = self._writable(key)
            old_epoch, old_view = tile.epoch[local], tile.view[local]
            fresh = (old_epoch != self.epoch) | (old_view < view[window]) | settled
            if exclude is not None:
                fresh &= ~exclude[window]
            if not fresh.any():
                continue
            undo.parts.append(
                (key, *local, tile.rgb[local].copy(), old_epoch.copy(), old_view.copy())
            )
            tile.rgb[local][fresh] = rgb[window][fresh]
            tile.epoch[local][fresh] = self.epoch
            tile.view[local][fresh] = view[window][fresh]
        self._evict()
        return undo

    def undo(self, record: UndoRecord) -> None:
        """Restore what a :meth:`write` replaced (newest write first when undoing several)."""
        for key, ys, xs, rgb, epoch, view in reversed(record.parts):
            if key not in self._tiles:  # forgotten since (LRU): nothing to restore
                continue
            tile = self._writable(key)
            tile.rgb[ys, xs] = rgb
            tile.epoch[ys, xs] = epoch
            tile.view[ys, xs] = view

    def new_epoch(self) -> None:
        """Everything remembered so far becomes stale (a prompt switch: restyle on sight)."""
        self.epoch += 1

    def _evict(self) -> None:
        while len(self._tiles) > self.max_tiles:
            key = min(self._used, key=self._used.get)
            del self._used[key]
            self._tiles.pop(key, None)
            self._owned.discard(key)

    # -- branches -------------------------------------------------------------------------
    def fork(self) -> SpatialMemory:
        """A copy that shares every tile copy-on-write with this memory."""
        other = SpatialMemory(self.tile, self.max_tiles, self.settle_px)
        other.epoch, other._tick = self.epoch, self._tick
        other._tiles, other._used = dict(self._tiles), dict(self._used)
        self._owned.clear()  # both now share every tile: the first write copies it
        return other

    @property
    def num_tiles(self) -> int:
        return len(self._tiles)


def centre_box(size: int, box: int) -> np.ndarray:
    """``(size, size)`` bool mask of the ``box × box`` square at the frame centre: the
    view-anchored player sprite, which must not be written into world memory."""
    mask = np.zeros((size, size), bool)
    if box > 0:
        c, h = size // 2, box // 2
        mask[c - h : c + h + 1, c - h : c + h + 1] = True
    return mask


def model_inputs(read: MemoryRead, downsample: int) -> tuple[np.ndarray, np.ndarray]:
    """What the world model is fed from a window: the picture ``(S, S, 3)`` uint8 with unknown
    pixels set to mid-grey (128), and the ``(2, S/d, S/d)`` float32 fractions of each latent
    pixel's ``d × d`` image pixels that are *current* (plane 0) and *stale* (plane 1),
    ``d = downsample`` (the autoencoder's)."""
    rgb = read.rgb.copy()
    rgb[~(read.current | read.stale)] = 128
    s = read.current.shape[0]
    g = s // downsample
    masks = np.stack([read.current, read.stale]).astype(np.float32)
    return rgb, masks.reshape(2, g, downsample, g, downsample).mean(axis=(2, 4))


def select_by_overlap(
    pages: list[int], origins: list, view: np.ndarray, size: int, k: int
) -> list[int]:
    """The ``k`` pages whose camera window (top-left ``origins[i]``, ``size × size`` px)
    overlaps the view at ``view`` (top-left, px) most, overlap > 0 only, in their original
    order: field-of-view retrieval of memory (Context-as-Memory, Yu et al. 2025)."""
    areas = []
    for page, (x0, y0) in zip(pages, origins):
        ox = max(0, size - abs(int(x0) - int(view[0])))
        oy = max(0, size - abs(int(y0) - int(view[1])))
        if ox * oy > 0:
            areas.append((ox * oy, page))
    best = {p for _, p in sorted(areas, key=lambda a: -a[0])[:k]}
    return [p for p in pages if p in best]
