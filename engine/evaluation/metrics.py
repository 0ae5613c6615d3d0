"""Image metrics for world-model evaluation, each validated on simulator ground truth
(``tests/evaluation/test_eval_metrics.py``): PSNR, phase-correlation motion, Laplacian sharpness, a
nearest-centroid scene classifier on colour histograms, gradient anisotropy, the fraction
of a frame off its scene's palette and the density of terrain-class boundaries."""

from __future__ import annotations

import numpy as np
from scipy.ndimage import uniform_filter
from scipy.signal.windows import tukey
from scipy.spatial import cKDTree

from worldstream.engine.worlds.simulator import player_mask


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    """PSNR in dB of uint8 images (peak 255)."""
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return float("inf") if mse == 0 else float(10 * np.log10(255.0**2 / mse))


def _gray(rgb: np.ndarray) -> np.ndarray:
    return rgb.astype(np.float64) @ np.array([0.299, 0.587, 0.114])


def image_shift(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """Translation ``(dx, dy)`` in pixels that moves image content of ``a`` to ``b`` (phase
    correlation with the centred player sprite masked out and a flat-top Tukey window, which
    reads ground truth better than a Hann window). Sub-pixel by a parabola fit."""
    h, w = a.shape[:2]
    win = np.outer(tukey(h, 0.25), tukey(w, 0.25))
    keep = ~player_mask(h)
    fa, fb = _gray(a), _gray(b)
    fa = (fa - fa[keep].mean()) * keep * win
    fb = (fb - fb[keep].mean()) * keep * win
    cross = np.fft.fft2(fb) * np.conj(np.fft.fft2(fa))
    cross /= np.abs(cross) + 1e-9
    corr = np.real(np.fft.ifft2(cross))
    iy, ix = np.unravel_index(np.argmax(corr), corr.shape)

    def refine(c_m, c_0, c_p):
        den = c_m - 2 * c_0 + c_p
        return 0.0 if abs(den) < 1e-12 else 0.5 * (c_m - c_p) / den

    dy = iy + refine(corr[iy - 1, ix], corr[iy, ix], corr[(iy + 1) % h, ix])
    dx = ix + refine(corr[iy, ix - 1], corr[iy, ix], corr[iy, (ix + 1) % w])
    dy = dy - h if dy > h / 2 else dy
    dx = dx - w if dx > w / 2 else dx
    return float(dx), float(dy)


def motion_class(dx: float, dy: float, threshold: float = 0.5) -> tuple[int, int]:
    """Per-axis direction in {-1, 0, 1}: |d| below ``threshold`` pixels counts as still."""
    return (
        int(np.sign(dx)) if abs(dx) >= threshold else 0,
        int(np.sign(dy)) if abs(dy) >= threshold else 0,
    )


def sharpness(rgb: np.ndarray) -> float:
    """Variance of the 4-neighbour Laplacian of the grey image (blur lowers it)."""
    g = _gray(rgb)
    lap = -4 * g[1:-1, 1:-1] + g[:-2, 1:-1] + g[2:, 1:-1] + g[1:-1, :-2] + g[1:-1, 2:]
    return float(lap.var())


def colour_features(rgb: np.ndarray, bins: int = 6) -> np.ndarray:
    """Normalised joint RGB histogram (``bins``³ values) of a frame, sprite excluded."""
    pix = rgb[~player_mask(rgb.shape[0])].astype(np.int64) * bins // 256
    idx = (pix[:, 0] * bins + pix[:, 1]) * bins + pix[:, 2]
    hist = np.bincount(idx, minlength=bins**3).astype(np.float64)
    return hist / hist.sum()


class SceneClassifier:
    """Nearest-centroid scene classifier on colour histograms, fitted on simulator frames."""

    def __init__(self, frames_by_scene: dict[str, np.ndarray]):
        self.names = list(frames_by_scene)
        self.centroids = np.stack(
            [
                np.mean([colour_features(f) for f in frames], axis=0)
                for frames in frames_by_scene.values()
            ]
        )

    def predict(self, rgb: np.ndarray) -> str:
        d = np.linalg.norm(self.centroids - colour_features(rgb), axis=1)
        return self.names[int(np.argmin(d))]


def anisotropy(rgb: np.ndarray) -> float:
    """Gradient anisotropy ``|Gx² - Gy²| / (Gx² + Gy²)`` of the grey image, sprite excluded:
    0 = no preferred direction (natural terrain), 1 = pure stripes (detects streaks)."""
    g = _gray(rgb)
    keep = ~player_mask(g.shape[0])
    gx = np.diff(g, axis=1)[:-1] ** 2
    gy = np.diff(g, axis=0)[:, :-1] ** 2
    m = keep[:-1, :-1] & keep[1:, 1:]
    sx, sy = gx[m].sum(), gy[m].sum()
    return float(abs(sx - sy) / (sx + sy + 1e-9))


def mean_luma(rgb: np.ndarray) -> float:
    """Mean luma (Rec. 601 weights, 0-255) of a frame."""
    return float(_gray(rgb).mean())


#: RGB distance (levels, Euclidean) beyond which a pixel counts as off its scene's palette:
#: above the autoencoder's own round-trip error on blended edges, below a wrong-colour ground
OFF_PALETTE_LEVELS = 20.0


class ScenePalette:
    """The colours the simulator draws in one scene: every distinct RGB value of ``frames``
    ``(N, H, W, 3)`` uint8 (other worlds of the scene, the centred player sprite excluded;
    terrain classes times their texture, water, creatures), searched with scipy's k-d tree."""

    def __init__(self, frames: np.ndarray):
        if frames.ndim != 4 or frames.shape[-1] != 3:
            raise ValueError(f"frames must be (N, H, W, 3), got {frames.shape}")
        pixels = frames[:, ~player_mask(frames.shape[1])].reshape(-1, 3)
        self.colours = np.unique(pixels, axis=0)
        self._tree = cKDTree(self.colours.astype(np.float64))

    def off_fraction(self, rgb: np.ndarray, levels: float = OFF_PALETTE_LEVELS) -> float:
        """Fraction in [0, 1] of the frame's pixels ``(H, W, 3)`` uint8 (sprite excluded)
        farther than ``levels`` (Euclidean RGB) from every colour of the palette: 0 for any
        world of the scene the simulator draws, colours the scene does not have (mottle
        summed from several samples, a scene's colours in another scene) raise it."""
        pixels = rgb[~player_mask(rgb.shape[0])].reshape(-1, 3).astype(np.float64)
        dist, _ = self._tree.query(pixels, distance_upper_bound=levels + 1)
        return float(np.mean(dist > levels))


#: the brightness range (times a class's palette colour) the simulator draws a terrain class
#: at: its texture (0.9-1.1) times water shimmer (0.86-1.14) times cloud shadow (down to
#: 1 - 0.55 * 0.45 * 1.6 = 0.60 in the meadow; ``engine.worlds.simulator.render``)
CLASS_SCALE = (0.5, 1.3)


def terrain_classes(rgb: np.ndarray, palette: np.ndarray) -> np.ndarray:
    """The terrain class of each pixel of ``rgb (H, W, 3)`` uint8: the row of ``palette``
    ``(K, 3)`` (a scene's class colours, ``engine.worlds.scenes.palette``) whose colour, scaled
    by the best brightness within :data:`CLASS_SCALE`, lies nearest (least squares). Returns
    ``(H, W)`` int64. On the simulator's own frames nearly every pixel outside the sprite gets
    its true class (the misses are creatures)."""
    p = np.asarray(palette, np.float64)
    x = rgb.reshape(-1, 3).astype(np.float64)
    scale = np.clip(x @ p.T / np.sum(p * p, axis=1), *CLASS_SCALE)  # (N, K)
    err = np.sum((x[:, None, :] - scale[..., None] * p[None]) ** 2, axis=-1)
    return np.argmin(err, axis=1).reshape(rgb.shape[:2])


#: the side (px) of the neighbourhood whose majority class a pixel takes before boundaries are
#: counted: it removes the single-pixel class flips of the autoencoder's round trip between
#: close colours, while a real mottle a few pixels across survives it
MAJORITY_PX = 3


def boundary_density(rgb: np.ndarray, palette: np.ndarray, majority: int = MAJORITY_PX) -> float:
    """Fraction in [0, 1] of the 4-neighbour pixel pairs of a frame ``(H, W, 3)`` uint8 whose
    terrain classes differ, pairs touching the sprite's box excluded. Each pixel takes the
    majority class (:func:`terrain_classes`) of the ``majority × majority`` px around it
    (``scipy.ndimage.uniform_filter`` on the classes' indicator planes; 1: none). The
    simulator's terrain is large regions of one class with a few speckled ones (vegetation),
    so its frames read low. A mottle of the scene's own colours,
    which :meth:`ScenePalette.off_fraction` does not see, raises it."""
    classes = terrain_classes(rgb, palette)
    if majority > 1:
        planes = (classes[None] == np.arange(len(palette))[:, None, None]).astype(np.float32)
        votes = uniform_filter(planes, size=(1, majority, majority), mode="nearest")
        classes = np.argmax(votes, axis=0)
    keep = ~player_mask(rgb.shape[0])
    across = keep[:, 1:] & keep[:, :-1]
    down = keep[1:] & keep[:-1]
    changes = (np.sum((classes[:, 1:] != classes[:, :-1]) & across)
               + np.sum((classes[1:] != classes[:-1]) & down))
    return float(changes / (across.sum() + down.sum()))
