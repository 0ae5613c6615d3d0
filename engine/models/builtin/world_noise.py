"""World-anchored noise: each frame's initial denoising noise read from a fixed Gaussian field
in world coordinates at the frame's camera window.

A frame of the built-in world is a window onto a plane; new ground enters at a border and is
generated again by every frame until it settles in the spatial memory (``settle_px``). With
fresh noise each frame, each of those frames draws an *independent* sample of the same ground,
and what memory keeps is a mix of them: speckle and streaks along the motion. With the noise
pinned to the ground it belongs to, consecutive frames start from the same noise wherever they
overlap, so they refine one sample instead of averaging many. The idea is noise warping for
video diffusion (Chang et al., "How I Warped Your Noise", ICLR 2024; Burgert et al.,
"Go-with-the-Flow: Motion-Controllable Video Diffusion Models Using Real-Time Warped Noise",
CVPR 2025); for a translating camera the warp is an integer shift, so the field is simply read
at the window's position (nearest latent pixel: the camera moves in image pixels, the noise
lives on the latent grid, ``downsample`` image pixels a latent pixel).

The field is stateless: tile ``(tx, ty)`` of a field is drawn from a generator seeded by a
hash of ``(seed, slice, tx, ty)``, so any window of any size is reproducible from the seed
alone, nothing is stored, and forks of a stream read the same world.

Optionally (``period`` > 0) the field drifts slowly in its own time: a frame at field time
``t`` reads ``cos(θ)·field_k + sin(θ)·field_(k+1)`` with ``k, r = divmod(t, period)`` and
``θ = π/2 · r / period`` — still standard normal at every pixel, one time step to the next
correlated by ``cos(π / (2·period))``, independent ``2·period`` steps apart, and at ``t = 0``
exactly the fixed field. A field fixed in time gives a resting camera the same noise every
frame, so the model's bias there never averages out; drifting in stream time loses the
revisit gain instead (the trade-off is in the model card).
"""

from __future__ import annotations

import hashlib
import math

import torch

TILE = 16  # latent pixels a side per generated tile of the field


def _tile(seed: int, tx: int, ty: int, channels: int, time_slice: int = 0) -> torch.Tensor:
    """Tile ``(tx, ty)`` of field ``seed`` at ``time_slice``: ``(channels, TILE, TILE)``
    float32 standard normal."""
    key = b"".join(v.to_bytes(16, "little", signed=True)
                   for v in (seed, time_slice, tx, ty, channels))
    tile_seed = int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") >> 1
    return torch.randn((channels, TILE, TILE), generator=torch.Generator().manual_seed(tile_seed))


def window_noise(seed: int, x: int, y: int, channels: int, size: int,
                 time_slice: int = 0) -> torch.Tensor:
    """The field ``seed`` at ``time_slice`` read at latent pixel ``(x, y)`` (top-left, world
    latent coordinates, any sign): ``(channels, size, size)`` float32, standard normal at every
    pixel and independent between pixels and slices; two windows of one seed and slice agree
    wherever they overlap.

    >>> a = window_noise(7, 10, -3, 4, 32)
    >>> torch.equal(a[:, 1:, 2:], window_noise(7, 12, -2, 4, 32)[:, :-1, :-2])
    True
    """
    if channels < 1 or size < 1:
        raise ValueError(f"channels and size must be >= 1, got {channels}, {size}")
    out = torch.empty((channels, size, size))
    for ty in range(y // TILE, (y + size - 1) // TILE + 1):
        for tx in range(x // TILE, (x + size - 1) // TILE + 1):
            # the overlap of tile (tx, ty) with the window, in world latent pixels
            x0, x1 = max(tx * TILE, x), min((tx + 1) * TILE, x + size)
            y0, y1 = max(ty * TILE, y), min((ty + 1) * TILE, y + size)
            out[:, y0 - y : y1 - y, x0 - x : x1 - x] = _tile(seed, tx, ty, channels, time_slice)[
                :, y0 - ty * TILE : y1 - ty * TILE, x0 - tx * TILE : x1 - tx * TILE
            ]
    return out


def noise_margin(scale: float) -> int:
    """Latent pixels of white noise needed on each side of a window for :func:`low_pass` of
    ``scale``: three standard deviations of its Gaussian, rounded up."""
    return int(math.ceil(3 * scale))


def low_pass(wide: torch.Tensor, scale: float) -> torch.Tensor:
    """White standard normal noise ``wide (..., h + 2m, w + 2m)`` (``m`` =
    :func:`noise_margin`), blurred by a Gaussian of ``scale`` latent pixels (standard deviation)
    and cropped by ``m`` on every side: ``(..., h, w)`` float32, still standard normal at every
    pixel (the kernel has unit L2 norm), correlated over about ``scale`` pixels.
    ValueError for a scale <= 0 or a field smaller than its margins."""
    if scale <= 0:
        raise ValueError(f"scale must be > 0 latent px, got {scale}")
    m = noise_margin(scale)
    if wide.shape[-1] <= 2 * m or wide.shape[-2] <= 2 * m:
        raise ValueError(f"a field of {tuple(wide.shape[-2:])} px has no inside after the "
                         f"margins of {m} px")
    x = torch.arange(-m, m + 1, dtype=torch.float32)
    g = torch.exp(-0.5 * (x / scale) ** 2)
    g = g / g.square().sum().sqrt()  # separable: the 2-D kernel's L2 norm is this one's squared
    lead = wide.shape[:-2]
    flat = wide.reshape(-1, 1, *wide.shape[-2:]).float()
    flat = torch.nn.functional.conv2d(flat, g.view(1, 1, 1, -1))
    flat = torch.nn.functional.conv2d(flat, g.view(1, 1, -1, 1))
    return flat.reshape(*lead, *flat.shape[-2:])


def correlated(white: torch.Tensor, wide: torch.Tensor, correlation: float,
               scale: float) -> torch.Tensor:
    """``√(1−c)·white + √c·low_pass(wide, scale)`` with ``c`` = ``correlation``: standard
    normal at every pixel, a share ``c`` of its variance spread over ``scale`` latent pixels
    (``white (..., h, w)``, ``wide (..., h + 2m, w + 2m)`` independent white noise, float32).
    Noise with more power at low spatial frequencies than white noise, as in the
    multi-resolution ("pyramid") noise of Whitaker (2023) and the low-frequency emphasis of
    FreeInit (Wu et al., ECCV 2024). ValueError for a correlation outside [0, 1)."""
    if not 0.0 <= correlation < 1.0:
        raise ValueError(f"correlation must be in [0, 1), got {correlation}")
    if correlation == 0.0:
        return white
    return math.sqrt(1 - correlation) * white + math.sqrt(correlation) * low_pass(wide, scale)


def training_noise(shape: tuple[int, ...], generator: torch.Generator, correlation: float,
                   scale: float) -> torch.Tensor:
    """Noise of ``shape (..., h, w)`` float32 as :func:`chunk_noise` draws it with the same
    ``correlation`` and ``scale``, from ``generator`` (white when ``correlation`` is 0)."""
    white = torch.randn(shape, generator=generator)
    if correlation == 0.0:
        return white
    m = noise_margin(scale)
    wide = torch.randn((*shape[:-2], shape[-2] + 2 * m, shape[-1] + 2 * m), generator=generator)
    return correlated(white, wide, correlation, scale)


#: the slice of a field whose white noise the low-pass part of :func:`chunk_noise` reads
#: (independent of the white part's slices, which count up from 0)
LOW_PASS_SLICE = -1


def chunk_noise(seed: int, origins, times, downsample: int, channels: int, size: int,
                period: int = 0, correlation: float = 0.0, scale: float = 2.0) -> torch.Tensor:
    """Initial noise of a chunk whose frames' camera windows sit at ``origins`` (``(F, 2)``
    world image px, top-left ``(x, y)``) at field times ``times`` (``F`` ints >= 0): ``(F,
    channels, size, size)`` float32, each frame the field read at the latent pixel containing
    its origin (floor division by ``downsample``), drifting over ``period`` time steps (0:
    fixed in time, ``times`` unused). With ``correlation`` > 0, a share of each pixel's
    variance comes from a low-passed field (:func:`correlated`; its own slice of the field,
    fixed in time, so it too sits on the ground). ValueError for a negative period or a
    correlation outside [0, 1)."""
    if period < 0:
        raise ValueError(f"period must be >= 0 frames, got {period}")
    if not 0.0 <= correlation < 1.0:
        raise ValueError(f"correlation must be in [0, 1), got {correlation}")
    frames = []
    for (ox, oy), t in zip(origins, times):
        x, y = int(ox) // downsample, int(oy) // downsample
        if period == 0:
            white = window_noise(seed, x, y, channels, size)
        else:
            k, r = divmod(int(t), period)
            theta = 0.5 * math.pi * r / period
            white = (math.cos(theta) * window_noise(seed, x, y, channels, size, k)
                     + math.sin(theta) * window_noise(seed, x, y, channels, size, k + 1))
        if correlation > 0.0:
            m = noise_margin(scale)
            wide = window_noise(seed, x - m, y - m, channels, size + 2 * m, LOW_PASS_SLICE)
            white = correlated(white, wide, correlation, scale)
        frames.append(white)
    return torch.stack(frames)
