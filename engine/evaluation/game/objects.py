"""Moving objects of a game, found the same way in every game (no per-game code).

A *moving object* of frame ``t`` is a set of pixels that changed since frame ``t - 1``, all of
one palette colour in frame ``t`` and 8-connected to each other. Pixels that turned into the
frame's background (its most common colour) are where something left, not an object: a ball
moved by one pixel is one object of the ball's colour, not also a background-coloured streak.

Frames here are palette indices, ``(N, H, W)`` of a small non-negative integer dtype (``uint8``
from ``Palette.encode``); a pair of ``(N, H, W)`` stacks ``prev`` and ``cur`` is ``N`` frame
transitions. "Within ``radius`` px" is the square neighbourhood (Chebyshev distance).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import ndimage
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components, maximum_bipartite_matching

RADIUS = 2
"""How near (px) a pixel of an object's colour must be for the object to count as found."""

_CHUNK = 512
"""Transitions labelled at once (bounds the memory of the pixel graph)."""

#: the four forward neighbour offsets (dy, dx): with their mirrors, 8-connectivity
_FORWARD = ((0, 1), (1, -1), (1, 0), (1, 1))


@dataclass
class Objects:
    """The moving objects of ``N`` transitions.

    ``labels``: ``(N, H, W)`` int32, 0 off any object, ``i + 1`` on object ``i``;
    ``colour``: ``(n,)`` int64 palette index of each object; ``frame``: ``(n,)`` int64 the
    transition each object belongs to.
    """

    labels: np.ndarray
    colour: np.ndarray
    frame: np.ndarray

    def __len__(self) -> int:
        return len(self.colour)

    def any_at(self, mask: np.ndarray) -> np.ndarray:
        """``(n,)`` bool: each object has a pixel where ``mask`` (``(N, H, W)`` bool) holds."""
        hit = np.bincount(self.labels[mask], minlength=len(self) + 1)
        return hit[1:] > 0


def changed(prev: np.ndarray, cur: np.ndarray) -> np.ndarray:
    """``(N, H, W)`` bool: the pixels whose colour differs between ``prev`` and ``cur``."""
    return prev != cur


def background(frames: np.ndarray) -> np.ndarray:
    """``(N,)`` int64: each frame's most common colour (the lowest index on a tie)."""
    n = len(frames)
    k = int(frames.max()) + 1 if frames.size else 1
    flat = frames.reshape(n, -1).astype(np.int64) + (np.arange(n) * k)[:, None]
    return np.bincount(flat.ravel(), minlength=n * k).reshape(n, k).argmax(1)


def _pairs(shape: tuple[int, int], dy: int, dx: int) -> tuple[tuple, tuple]:
    """Slices ``a, b`` of ``(N, H, W)`` so that ``x[b]`` is ``x[a]``'s neighbour at
    ``(dy, dx)`` (``dy >= 0``)."""
    h, w = shape
    a = (slice(None), slice(0, h - dy), slice(max(0, -dx), w - max(0, dx)))
    b = (slice(None), slice(dy, h), slice(max(0, dx), w + min(0, dx)))
    return a, b


def _label_same_colour(frames: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, int]:
    """Components of ``mask`` (``(N, H, W)`` bool) whose 8-neighbours share ``frames``'
    colour, never across frames -> ``(labels (N, H, W) int32, count)``."""
    # NOTE: one graph over the masked pixels instead of one ndimage.label per colour: the cost
    # does not grow with the palette (a game frame scaled to a 64-colour palette, or more)
    count = int(mask.sum())
    labels = np.zeros(mask.shape, np.int32)
    if count == 0:
        return labels, 0
    node = np.full(mask.shape, -1, np.int32)
    node[mask] = np.arange(count, dtype=np.int32)
    rows, cols = [], []
    for dy, dx in _FORWARD:
        a, b = _pairs(mask.shape[1:], dy, dx)
        join = mask[a] & mask[b] & (frames[a] == frames[b])
        rows.append(node[a][join])
        cols.append(node[b][join])
    rows, cols = np.concatenate(rows), np.concatenate(cols)
    graph = coo_matrix((np.ones(len(rows), np.int8), (rows, cols)), shape=(count, count))
    n, comp = connected_components(graph, directed=False)
    labels[mask] = comp + 1
    return labels, n


def moving_objects(prev: np.ndarray, cur: np.ndarray) -> Objects:
    """The moving objects of the transitions ``prev -> cur`` (each ``(N, H, W)`` palette
    indices), labelled by their colour in ``cur``."""
    if prev.shape != cur.shape or cur.ndim != 3:
        raise ValueError(f"prev and cur must both be (N, H, W), got {prev.shape} {cur.shape}")
    labels = np.zeros(cur.shape, np.int32)
    total = 0
    for s in range(0, len(cur), _CHUNK):
        p, c = prev[s:s + _CHUNK], cur[s:s + _CHUNK]
        mask = changed(p, c) & (c != background(c)[:, None, None])
        part, n = _label_same_colour(c, mask)
        labels[s:s + _CHUNK] = np.where(part > 0, part + total, 0)
        total += n
    colour = np.zeros(total, np.int64)
    frame = np.zeros(total, np.int64)
    flat = labels.ravel()
    at = np.flatnonzero(flat)
    colour[flat[at] - 1] = cur.ravel()[at]
    frame[flat[at] - 1] = at // (cur.shape[1] * cur.shape[2])
    return Objects(labels, colour, frame)


def _shifts(radius: int):
    return [(dy, dx) for dy in range(-radius, radius + 1) for dx in range(-radius, radius + 1)]


def colour_near(frames: np.ndarray, query: np.ndarray, radius: int = RADIUS) -> np.ndarray:
    """``(N, H, W)`` bool: ``frames`` has a pixel of colour ``query[n, y, x]`` within
    ``radius`` px of ``(y, x)`` (both ``(N, H, W)`` palette indices)."""
    h, w = frames.shape[1:]
    padded = np.pad(frames.astype(np.int32), ((0, 0), (radius, radius), (radius, radius)),
                    constant_values=-1)
    near = np.zeros(frames.shape, bool)
    for dy, dx in _shifts(radius):
        near |= padded[:, radius + dy:radius + dy + h, radius + dx:radius + dx + w] == query
    return near


def dilate(mask: np.ndarray, radius: int = RADIUS) -> np.ndarray:
    """``(N, H, W)`` bool: within ``radius`` px of a pixel of ``mask``, frame by frame."""
    if radius == 0:
        return mask.copy()
    return ndimage.maximum_filter(mask, size=(1, 2 * radius + 1, 2 * radius + 1),
                                  mode="constant", cval=False)


def _touching(a: Objects, b: Objects, radius: int) -> coo_matrix:
    """``(len(a), len(b))`` sparse: object ``i`` of ``a`` and ``j`` of ``b`` are of one colour,
    in the same transition, and a pixel of ``j`` is within ``radius`` px of a pixel of ``i``."""
    la, lb = a.labels, b.labels
    h, w = la.shape[1:]
    padded = np.pad(lb, ((0, 0), (radius, radius), (radius, radius)))
    rows, cols = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
    on_a = la > 0
    for dy, dx in _shifts(radius):
        shifted = padded[:, radius + dy:radius + dy + h, radius + dx:radius + dx + w]
        both = on_a & (shifted > 0)
        rows.append(la[both].astype(np.int64) - 1)
        cols.append(shifted[both].astype(np.int64) - 1)
    r, c = np.concatenate(rows), np.concatenate(cols)
    same = a.colour[r] == b.colour[c]
    r, c = r[same], c[same]
    return coo_matrix((np.ones(len(r), np.int8), (r, c)), shape=(len(a), len(b)))


def matched(a: Objects, b: Objects, radius: int = RADIUS) -> int:
    """Pairs of a one-to-one matching of ``a``'s objects to ``b``'s (both found on the same
    ``N`` transitions): each object of ``a`` to at most one object of ``b`` of its colour with
    a pixel within ``radius`` px of its own, and the other way round; the largest such
    matching. A field of still, flickering or duplicated objects in ``b`` cannot stand for
    ``a``'s: each of ``b``'s objects is used once, and an object that does not move is none."""
    if a.labels.shape != b.labels.shape:
        raise ValueError(f"objects of {a.labels.shape} and {b.labels.shape} transitions")
    if not len(a) or not len(b):
        return 0
    graph = _touching(a, b, radius).tocsr()  # repeated pairs summed: one edge each
    return int((maximum_bipartite_matching(graph, perm_type="column") >= 0).sum())


@dataclass
class Match:
    """Pooled counts: ``found`` of ``objects`` objects; ``rate`` is ``nan`` with none."""

    objects: int = 0
    found: int = 0

    @property
    def rate(self) -> float:
        return self.found / self.objects if self.objects else float("nan")


def match(a: Objects, b: Objects, radius: int = RADIUS) -> Match:
    """How many of ``a``'s objects ``b``'s match one to one (:func:`matched`): recall when
    ``a`` are the game's objects and ``b`` the model's, precision the other way round."""
    return Match(len(a), matched(a, b, radius))


def appearing(frames: np.ndarray, radius: int = RADIUS) -> tuple[Objects, np.ndarray]:
    """The moving objects of one played sequence ``frames`` ``(T, H, W)`` and ``(n,)`` bool:
    each *appears* (born as in :func:`play_figures`, and with no pixel of its colour within
    ``radius`` px in the frame before: a still paddle that starts to move was there already; a
    serve's ball was not). No object of the first transition appears."""
    prev, cur = frames[:-1], frames[1:]
    objects = moving_objects(prev, cur)
    moved_before = np.zeros(cur.shape, bool)
    moved_before[1:] = dilate(changed(prev[:-1], cur[:-1]), radius)
    there = colour_near(prev, cur, radius)
    born = ~objects.any_at((moved_before | there) & (objects.labels > 0))
    return objects, born & (objects.frame > 0)


def births(frames: np.ndarray, radius: int = RADIUS) -> np.ndarray:
    """``(T - 1,)`` int64: the objects that appear (:func:`appearing`) on each transition of
    one played sequence ``frames`` ``(T, H, W)``."""
    objects, born = appearing(frames, radius)
    return np.bincount(objects.frame[born], minlength=len(frames) - 1).astype(np.int64)


def play_figures(frames: np.ndarray, judged: np.ndarray | None = None,
                 radius: int = RADIUS) -> dict:
    """Moving objects per frame and births per 100 frames of one played sequence.

    ``frames``: ``(T, H, W)`` palette indices; ``judged``: ``(T - 1,)`` bool, the transitions
    counted (default all; leave out an env's reset). A *birth* is an object none of whose
    pixels is within ``radius`` px of a pixel that changed in the transition before (a serve,
    a shot, a new enemy); the first transition has none before it and is not judged for
    births. Values are ``nan`` where nothing is judged.
    """
    prev, cur = frames[:-1], frames[1:]
    judged = np.ones(len(cur), bool) if judged is None else np.asarray(judged, bool)
    objects = moving_objects(prev, cur)
    moved_before = np.zeros(cur.shape, bool)
    moved_before[1:] = dilate(changed(prev[:-1], cur[:-1]), radius)
    born = ~objects.any_at(moved_before & (objects.labels > 0))
    counted = judged[objects.frame]
    birth_judged = judged.copy()
    birth_judged[:1] = False
    n_frames, n_birth_frames = int(judged.sum()), int(birth_judged.sum())
    births = int((born & birth_judged[objects.frame]).sum())
    return {"objects_per_frame": int(counted.sum()) / n_frames if n_frames else float("nan"),
            "births_per_100": 100 * births / n_birth_frames if n_birth_frames
            else float("nan")}


def outline(labels: np.ndarray) -> np.ndarray:
    """``(N, H, W)`` bool: the 1-px ring just outside each object of ``labels`` (8-neighbours
    that are off every object)."""
    on = labels > 0
    return dilate(on, 1) & ~on


def rollout_table(before: np.ndarray, last: np.ndarray, truth: np.ndarray, pred: np.ndarray,
                  horizons: tuple[int, ...] = (1, 4, 16), radius: int = RADIUS) -> dict:
    """Object recall and precision ``k`` frames into rollouts from ``B`` starts, with the
    game's twin and the copy-last baseline.

    ``before``, ``last``: ``(B, H, W)`` the game's last two frames before each rollout;
    ``truth``, ``pred``: ``(B, h, H, W)`` the game's and the model's next ``h`` frames (all
    palette indices). At ``k``, the game's objects are those of ``truth[:, k-2] -> truth[:,
    k-1]`` (``last`` before the first) and the model's those of its own frames the same way;
    the two are matched one to one (:func:`matched`). *Recall*: the share of the game's
    objects matched; *precision*: the share of the model's; both pooled over all starts
    (``nan`` without objects). The twin (``gt_``) is the game against itself. Copy-last holds
    ``last``: its objects are those of the last true transition ``before -> last``.
    """
    out: dict = {}
    held = moving_objects(before, last)
    for k in horizons:
        if k > truth.shape[1]:
            raise ValueError(f"horizon {k} is past the rollouts' {truth.shape[1]} frames")
        game_prev = last if k == 1 else truth[:, k - 2]
        model_prev = last if k == 1 else pred[:, k - 2]
        game = moving_objects(game_prev, truth[:, k - 1])
        model = moving_objects(model_prev, pred[:, k - 1])
        both, twin, kept = matched(game, model, radius), matched(game, game, radius), \
            matched(game, held, radius)
        out |= {f"object_recall_{k}": Match(len(game), both).rate,
                f"gt_object_recall_{k}": Match(len(game), twin).rate,
                f"copylast_object_recall_{k}": Match(len(game), kept).rate,
                f"object_precision_{k}": Match(len(model), both).rate,
                f"gt_object_precision_{k}": Match(len(game), twin).rate,
                f"copylast_object_precision_{k}": Match(len(held), kept).rate,
                f"game_objects_{k}": len(game)}
    return out
