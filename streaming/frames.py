"""Frame helpers shared by the transports and the recorder: even padding, nearest-neighbour
scaling of pixel-art frames, JPEG encoding."""

from __future__ import annotations

import base64
import io

import numpy as np
from PIL import Image


def pad_even(rgb: np.ndarray) -> np.ndarray:
    """``(H, W, 3)`` uint8 -> ``(H + H % 2, W + W % 2, 3)`` by repeating the last row/column
    (4:2:0 video codecs need even sizes). Returns the input itself when already even; raises
    ValueError for anything but a non-empty ``(H, W, 3)`` uint8 array."""
    if rgb.dtype != np.uint8 or rgb.ndim != 3 or rgb.shape[2] != 3 or 0 in rgb.shape:
        raise ValueError(f"expected a (H, W, 3) uint8 frame, got {rgb.shape} {rgb.dtype}")
    pad_h, pad_w = rgb.shape[0] % 2, rgb.shape[1] % 2
    if not pad_h and not pad_w:
        return rgb
    return np.pad(rgb, ((0, pad_h), (0, pad_w), (0, 0)), mode="edge")


#: a pixel-art world's video is scaled up to at least this many pixels on its short side
PIXEL_ART_MIN_SIDE = 256


def video_scale(width: int, height: int, pixel_art: bool) -> int:
    """The integer factor a session's frames are scaled up by before encoding: 1 for a world
    that is not pixel art, else the smallest even factor that gives ``PIXEL_ART_MIN_SIDE``
    pixels on the short side (64x64 -> 4: 256x256; 210x160 -> 2; 256 or more -> 1). Even: a
    4:2:0 chroma sample (2x2 pixels) then never straddles two of the world's pixels.

    NOTE: a 64x64 frame sent as 64x64 VP8 (or JPEG) keeps chroma at 32x32 (4:2:0) and codes it
    in 8x8 blocks, so each colour bleeds a game pixel or more into its neighbours and the
    browser's 9x upscale shows it. Scaled up by 4 with nearest neighbour first, a game pixel is
    a 4x4 block, its chroma 2x2 samples of its own, and block edges fall on pixel edges."""
    factor = -(-PIXEL_ART_MIN_SIDE // max(1, min(width, height)))
    if not pixel_art or factor <= 1:
        return 1
    return factor + factor % 2


def upscale_nearest(rgb: np.ndarray, factor: int) -> np.ndarray:
    """``(H, W, 3)`` -> ``(H * factor, W * factor, 3)``, each pixel a ``factor`` x ``factor``
    block; the input itself for factor 1."""
    if factor == 1:
        return rgb
    if factor < 1:
        raise ValueError(f"factor must be a positive int, got {factor!r}")
    return np.repeat(np.repeat(rgb, factor, axis=0), factor, axis=1)


def encode_jpeg(rgb: np.ndarray, quality: int = 90, full_chroma: bool = False) -> bytes:
    """JPEG bytes of an ``(H, W, 3)`` uint8 RGB frame; chroma 4:2:0, or 4:4:4 with
    ``full_chroma``."""
    out = io.BytesIO()
    extra = {"subsampling": 0} if full_chroma else {}
    Image.fromarray(rgb).save(out, format="JPEG", quality=quality, **extra)
    return out.getvalue()


def jpeg_data_url(rgb: np.ndarray, quality: int = 80) -> str:
    return "data:image/jpeg;base64," + base64.b64encode(encode_jpeg(rgb, quality)).decode()
