"""The built-in family's ``show`` stage: a chunk's frames from its latents.

With ``pixel_residual``, where memory holds current content a frame shows the remembered
pixels plus the model's change to them (``memory + decode(x0) - decode(base)``): remembered
ground keeps its full sharpness instead of the autoencoder's, and what the model changes
(water, clouds, creatures, a head turn) still shows. The change may be soft-thresholded
(``residual_deadzone``: wavelet shrinkage, Donoho & Johnstone 1994) and faded to the model's
own decode where it is large (``residual_gate``); the detail carried onto ground still being
refined is kept as shading and limited (``refining_detail_*``); then the colour anchor.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from scipy import ndimage

from worldstream.engine.backends.builtin.colour import anchor_colours
from worldstream.engine.backends.builtin.state import MemoryViews
from worldstream.engine.backends.stages import ChunkBatch

if TYPE_CHECKING:
    from worldstream.engine.backends.builtin.protocol import BuiltinRunner

#: side (px) of the square over which ``residual_gate`` averages the change's magnitude, so
#: that one noisy pixel does not switch alone (a speckle of memory and decode)
GATE_WINDOW = 5


def show(backend: BuiltinRunner, batch: ChunkBatch) -> None:
    """Stage: each row's frames ``(F, H, W, 3)`` uint8."""
    batch.frames = compose(backend, batch.states, batch.records, batch.x0, batch.views)


def compose(backend: BuiltinRunner, states: list, records: list, x0, views: MemoryViews
            ) -> list[np.ndarray]:
    """Each state's frames ``(F, H, W, 3)`` uint8 for its latents ``x0 (B, F, C, h, w)``."""
    cfg = backend.config
    flat = x0.reshape(-1, *x0.shape[2:])
    if not cfg.pixel_residual:
        rgb = backend.decode_latents(flat)
    else:
        model = backend.decode_latents(flat.float().cpu()).astype(np.int16)
        decoded = np.stack([backend.base_cache.decoded(backend, k, z)
                            for k, z in zip(views.keys, views.base)])
        change = model - decoded
        pictures = views.pictures
        if cfg.refining_detail_shading or cfg.refining_detail_cap is not None:
            pictures = refining_detail(backend, states, views, decoded)
        weight = (residual_weight(change, *cfg.residual_gate)
                  if cfg.residual_gate is not None else None)
        if cfg.residual_deadzone > 0:
            change = shrink_change(change, cfg.residual_deadzone)
        shown = np.clip(pictures + change, 0, 255)
        if weight is not None:
            shown = np.rint(weight * shown + (1 - weight) * model)
        rgb = np.where(views.current[..., None], shown.astype(np.uint8),
                       model.astype(np.uint8))
    if cfg.colour_anchor is not None:
        anchor_colours(backend, states, records, rgb, views)
    return list(rgb.reshape(len(states), backend.chunk_frames, backend.height,
                            backend.width, 3))


def refining_detail(backend: BuiltinRunner, states: list, views: MemoryViews,
                    decoded: np.ndarray) -> np.ndarray:
    """The memory pictures ``(N, H, W, 3)`` int16 with the detail on each frame's refining
    pixels (picture less its decoded base ``decoded``) kept as shading of the decoded colour
    (:func:`shading_detail`), then scaled by :func:`detail_gain` against its state's
    ``detail_reference``."""
    pictures = views.pictures.astype(np.int16)
    cap = backend.config.refining_detail_cap
    shading = backend.config.refining_detail_shading
    f = backend.chunk_frames
    for n, state in enumerate(states):
        limit = cap is not None and state.detail_reference is not None
        if not (limit or shading):
            continue
        for i in range(n * f, (n + 1) * f):
            refining = views.refining[i]
            under = decoded[i][refining]
            detail = (pictures[i][refining] - under).astype(np.float64)
            if shading:
                detail = shading_detail(detail, under)
            gain = detail_gain(detail, state.detail_reference, cap) if limit else 1.0
            pictures[i][refining] = under + np.rint(gain * detail).astype(np.int16)
    return pictures


def shading_detail(detail: np.ndarray, colour: np.ndarray) -> np.ndarray:
    """The part of each pixel's ``detail`` ``(..., 3)`` (levels) along its ``colour``
    ``(..., 3)`` (0-255 RGB; one level added, so that black has a direction): ``(d·c / c·c)
    c``, float64 — brighter or darker, never a colour of its own."""
    c = colour.astype(np.float64) + 1.0
    return np.sum(detail * c, axis=-1, keepdims=True) / np.sum(c * c, axis=-1, keepdims=True) * c


def detail_gain(detail: np.ndarray, reference: float, cap: float) -> float:
    """The factor in (0, 1] that brings the RMS of ``detail`` (``(..., 3)`` levels) down to
    at most ``cap * reference`` levels (1 when it is already, or when ``detail`` is empty)."""
    if detail.size == 0:
        return 1.0
    rms = float(np.sqrt(np.mean(np.square(detail, dtype=np.float64))))
    return min(1.0, cap * reference / rms) if rms > 0 else 1.0


def shrink_change(change: np.ndarray, tau: float) -> np.ndarray:
    """Soft-threshold a change ``(..., 3)`` int16 levels by ``tau`` levels on each pixel's
    largest channel, keeping its hue: ``c · max(|c| - τ, 0) / |c|``, rounded."""
    mag = np.abs(change).max(axis=-1, keepdims=True).astype(np.float32)
    scale = np.maximum(mag - tau, 0.0) / np.maximum(mag, 1.0)
    return np.rint(change * scale).astype(np.int16)


def residual_weight(change: np.ndarray, t1: float, t2: float) -> np.ndarray:
    """The weight ``(N, H, W, 1)`` float32 in [0, 1] of memory plus change against the
    model's decode for changes ``(N, H, W, 3)`` int16: each pixel's largest channel's
    magnitude averaged over the :data:`GATE_WINDOW` square (edges reflected), mapped 1 at or
    under ``t1`` to 0 at or over ``t2``, linearly between."""
    magnitude = np.abs(change).max(axis=-1).astype(np.float32)
    magnitude = ndimage.uniform_filter(magnitude, size=(1, GATE_WINDOW, GATE_WINDOW),
                                       mode="reflect")
    return np.clip((t2 - magnitude) / (t2 - t1), 0.0, 1.0)[..., None]
