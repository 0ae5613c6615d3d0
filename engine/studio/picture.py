"""Start from a picture: a PNG or JPEG made into the model's first frame (Pillow).

The picture is centre-cropped to the model's aspect (a square for the built-in worlds) and
resized to its resolution (Lanczos, ``ImageOps.fit``); the backend encodes it and fills its
context with it as it does with its own start frames. Bad input raises :class:`PictureError`
with one line for the user.
"""

from __future__ import annotations

import base64
import io

import numpy as np

#: the largest upload read, bytes, and the most pixels decoded (a decompression bomb guard)
MAX_PICTURE_BYTES = 8 * 2**20
MAX_PICTURE_PIXELS = 40_000_000
_MAGIC = {b"\x89PNG\r\n\x1a\n": "PNG", b"\xff\xd8\xff": "JPEG"}


class PictureError(ValueError):
    """A picture that cannot be used (wrong type, too large, damaged)."""


def fit_picture(data: bytes, size: int, height: int | None = None) -> np.ndarray:
    """The picture in ``data`` (PNG or JPEG bytes) as a ``(height, size, 3)`` uint8 RGB frame
    (``height`` None: ``size``, a square): centre-cropped to that aspect, resized.
    PictureError for another file type, a file over ``MAX_PICTURE_BYTES`` or
    ``MAX_PICTURE_PIXELS``, or a damaged or cut-short picture."""
    from PIL import Image, ImageOps, UnidentifiedImageError

    shape = (size, height or size)  # (width, height) of the frame
    if not isinstance(data, bytes | bytearray) or not data:
        raise PictureError("no picture: send PNG or JPEG bytes")
    if len(data) > MAX_PICTURE_BYTES:
        raise PictureError(f"the picture is {len(data)} bytes; the limit is "
                           f"{MAX_PICTURE_BYTES}")
    kind = next((k for magic, k in _MAGIC.items() if bytes(data[:len(magic)]) == magic), None)
    if kind is None:
        raise PictureError("not a PNG or JPEG picture")
    try:
        image = Image.open(io.BytesIO(data))
        if image.format != kind:
            raise PictureError("not a PNG or JPEG picture")
        width, height = image.size
        if width * height > MAX_PICTURE_PIXELS:
            raise PictureError(f"the picture is {width}x{height} pixels; the limit is "
                               f"{MAX_PICTURE_PIXELS:,} pixels")
        image.load()
        image = ImageOps.exif_transpose(image).convert("RGB")
    except PictureError:
        raise
    except (OSError, SyntaxError, ValueError, UnidentifiedImageError, Image.DecompressionBombError
            ) as err:
        raise PictureError(f"the {kind} picture is damaged or cut short ({err})") from None
    fitted = ImageOps.fit(image, shape, Image.Resampling.LANCZOS, centering=(0.5, 0.5))
    return np.asarray(fitted, np.uint8).copy()


def png_base64(rgb: np.ndarray) -> str:
    """A ``(H, W, 3)`` uint8 frame as base64 PNG text (lossless: an input log's start)."""
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()


def frame_from_png_base64(text: str, size: int, height: int | None = None) -> np.ndarray:
    """The frame of :func:`png_base64` (a ``size`` wide, ``height`` high picture; None: a
    square); PictureError when it is not a PNG."""
    try:
        data = base64.b64decode(text, validate=True)
    except ValueError:
        raise PictureError("the start picture is not base64") from None
    rgb = fit_picture(data, size, height)
    return rgb
