"""The colour anchor: the running mean colour of the ground the model generates is held
within a tolerance of the stream's reference colour, channel by channel, before a frame is
shown and remembered (``BuiltinConfig.colour_anchor``).

New ground is generated next to the model's own earlier output, so a colour bias compounds in
space; averaged over seconds, a lake or a clearing passing by does not pull it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from worldstream.engine.backends.builtin.protocol import BuiltinRunner

#: the running mean keeps this much of itself a frame (~100 frames: a few seconds of moving)
ANCHOR_DECAY = 0.99
#: generated pixels a frame needs for its colour to count (a frame at rest shows none)
ANCHOR_MIN_PIXELS = 64


def anchor_colour(pixels: np.ndarray, mean: np.ndarray, reference: np.ndarray,
                  tolerance: float) -> np.ndarray:
    """The correction of generated ground ``pixels (P, 3)`` float64 (RGB levels) whose
    running mean colour is ``mean (3,)``, against ``reference (3,)`` with ``tolerance``
    levels, channel by channel: a channel above ``reference + tolerance`` is scaled down to
    it (a gain: dark pixels stay above black), one below ``reference - tolerance`` is lifted
    to it by a shift (a gain above 1 would raise the contrast of what it lifts); within the
    band nothing changes. Returns ``(P, 3)`` float64, unclipped."""
    target = np.clip(mean, reference - tolerance, reference + tolerance)
    gain = np.where(target < mean, target / np.maximum(mean, 1e-6), 1.0)
    lift = np.where(target > mean, target - mean, 0.0)
    return pixels * gain + lift


def anchor_colours(backend: BuiltinRunner, states: list, records: list, rgb: np.ndarray,
                   views: Any) -> None:
    """Correct the generated ground of frames ``rgb (N, H, W, 3)`` uint8, in place, against
    each stream's reference; each record keeps the running mean after its last frame and the
    reference it was kept against (a rewind takes both back with the record)."""
    tolerance = backend.config.colour_anchor
    generated = (~views.current | views.refining) & ~backend.exclude
    f = backend.chunk_frames
    for n, (state, rec) in enumerate(zip(states, records)):
        reference = state.colour_reference
        if reference is None:
            continue
        last = state.history[-1] if state.history else None
        mean = last.colour_mean if last is not None else None
        if last is not None and not np.array_equal(last.colour_reference, reference):
            # a prompt switch (or a rewind to chunks kept against another reference): the
            # running mean restarts at the first generated frame, so that the new scene's
            # colours are held from it on; after real frames it starts at their mean
            mean = None
        for i in range(n * f, (n + 1) * f):
            ground = generated[i]
            if ground.sum() < ANCHOR_MIN_PIXELS:
                continue
            pixels = rgb[i][ground].astype(np.float64)
            now = pixels.mean(axis=0)
            mean = now if mean is None else ANCHOR_DECAY * mean + (1 - ANCHOR_DECAY) * now
            rgb[i][ground] = np.clip(np.rint(anchor_colour(pixels, mean, reference,
                                                           tolerance)), 0, 255)
        # (a chunk without generated ground after a switch leaves the mean unset: the
        # restart waits for the first frame that has some)
        rec.colour_mean, rec.colour_reference = mean, reference
