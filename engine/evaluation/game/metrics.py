"""Metrics of a game world against the game, on what the game changes.

Whole-frame PSNR flatters a game (copying the last frame scores ~39 dB in Breakout), so every
figure here is judged beside the copy-last baseline or on the pixels that change. Frames are
``(..., H, W, 3)`` uint8 RGB; PSNR pools the squared error over all the frames given (peak 255)
and reads ``PSNR_CAP`` dB where the error is zero, so the env against itself has a number.
"""

from __future__ import annotations

import numpy as np

from worldstream.engine.worlds.game.frames import colour_codes

PSNR_CAP = 99.0


def pooled_psnr(a: np.ndarray, b: np.ndarray, mask: np.ndarray | None = None) -> float:
    """PSNR (dB) of the squared error pooled over all pixels (or those of ``mask``, shaped
    like the frames without channels); ``nan`` for an empty mask."""
    err = (a.astype(np.float64) - b.astype(np.float64)) ** 2
    err = err.mean(-1)
    if mask is not None:
        if not mask.any():
            return float("nan")
        err = err[mask]
    mse = float(err.mean())
    return PSNR_CAP if mse == 0 else min(PSNR_CAP, 10 * np.log10(255.0 ** 2 / mse))


def changed_psnr(pred: np.ndarray, truth: np.ndarray, previous: np.ndarray) -> float:
    """PSNR over the pixels where the true frame differs from the frame before it."""
    changed = (truth != previous).any(-1)
    return pooled_psnr(pred, truth, changed)


def effect_correlation(model_a: np.ndarray, model_b: np.ndarray, env_a: np.ndarray,
                       env_b: np.ndarray) -> float:
    """Pearson correlation of ``model(a) - model(b)`` with ``env(a) - env(b)``, pooled over
    every pixel and channel of all the pairs given; ``nan`` when the env shows no effect."""
    dm = model_a.astype(np.float64) - model_b.astype(np.float64)
    de = env_a.astype(np.float64) - env_b.astype(np.float64)
    dm, de = dm.ravel() - dm.mean(), de.ravel() - de.mean()
    denom = np.sqrt((dm ** 2).sum() * (de ** 2).sum())
    return float("nan") if denom == 0 else float((dm * de).sum() / denom)


def off_palette_share(frames: np.ndarray, game_colours: np.ndarray, window: int = 100
                      ) -> float:
    """The worst ``window``-frame share of pixels whose colour is not in ``game_colours``
    (``(K, 3)`` uint8, the colours the game shows)."""
    known = np.isin(colour_codes(frames), colour_codes(game_colours[None])[0])
    per_frame = 1.0 - known.reshape(len(frames), -1).mean(1)
    if len(per_frame) <= window:
        return float(per_frame.mean())
    sums = np.convolve(per_frame, np.ones(window) / window, mode="valid")
    return float(sums.max())


def change_rate(frames: np.ndarray) -> float:
    """The mean share of pixels that change from one frame to the next."""
    if len(frames) < 2:
        return 0.0
    return float((frames[1:] != frames[:-1]).any(-1).mean())
