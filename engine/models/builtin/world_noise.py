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
frame, so the model's bias there never averages out (a night world left idle for 3,000 frames
brightened by 11 levels where fresh noise gave 7); drifting in stream time loses the revisit
gain instead, so the built-in backend advances the field's time only while the camera has
rested for long (``engine.backends.builtin.BuiltinBackend._field_clock``;
assets/builtin/MODEL_CARD.md).
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


def chunk_noise(seed: int, origins, times, downsample: int, channels: int, size: int,
                period: int = 0) -> torch.Tensor:
    """Initial noise of a chunk whose frames' camera windows sit at ``origins`` (``(F, 2)``
    world image px, top-left ``(x, y)``) at field times ``times`` (``F`` ints >= 0): ``(F,
    channels, size, size)`` float32, each frame the field read at the latent pixel containing
    its origin (floor division by ``downsample``), drifting over ``period`` time steps (0:
    fixed in time, ``times`` unused). ValueError for a negative period."""
    if period < 0:
        raise ValueError(f"period must be >= 0 frames, got {period}")
    frames = []
    for (ox, oy), t in zip(origins, times):
        x, y = int(ox) // downsample, int(oy) // downsample
        if period == 0:
            frames.append(window_noise(seed, x, y, channels, size))
            continue
        k, r = divmod(int(t), period)
        theta = 0.5 * math.pi * r / period
        frames.append(math.cos(theta) * window_noise(seed, x, y, channels, size, k)
                      + math.sin(theta) * window_noise(seed, x, y, channels, size, k + 1))
    return torch.stack(frames)
