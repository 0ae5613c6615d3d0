"""Frame helpers shared by the transports and the recorder: even padding, JPEG encoding."""

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


def encode_jpeg(rgb: np.ndarray, quality: int = 90) -> bytes:
    """JPEG bytes of an ``(H, W, 3)`` uint8 RGB frame."""
    out = io.BytesIO()
    Image.fromarray(rgb).save(out, format="JPEG", quality=quality)
    return out.getvalue()


def jpeg_data_url(rgb: np.ndarray, quality: int = 80) -> str:
    return "data:image/jpeg;base64," + base64.b64encode(encode_jpeg(rgb, quality)).decode()
