"""World-anchored noise: each frame's initial denoising noise read from a fixed Gaussian field
in world coordinates at the frame's camera window.

A frame of the built-in world is a window onto a plane; new ground enters at a border and is
generated again by every frame until it settles in the spatial memory (``settle_px``). With
fresh noise each frame, each of those frames draws an *independent* sample of the same ground,
and what memory keeps is a mix of them: speckle and streaks along the motion. With the noise
pinned to the ground it belongs to, consecutive frames start from the same noise wherever they
overlap, so they refine one sample instead of averaging many. The idea is noise warping for
video diffusion (Chang et al., "How I Warped Your Noise", ICLR 2024; Burgert et al.,
"Go-with-the-Flow", CVPR 2025); for a translating camera the warp is an integer shift, so the
field is simply read at the window's position (nearest latent pixel: the camera moves in image
pixels, the noise lives on the latent grid, ``downsample`` image pixels a latent pixel).

The field is stateless: tile ``(tx, ty)`` of a field is drawn from a generator seeded by a
hash of ``(seed, tx, ty)``, so any window of any size is reproducible from the seed alone,
nothing is stored, and forks of a stream read the same world.
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch

TILE = 16  # latent pixels a side per generated tile of the field


def _tile(seed: int, tx: int, ty: int, channels: int) -> torch.Tensor:
    """Tile ``(tx, ty)`` of field ``seed``: ``(channels, TILE, TILE)`` float32 standard
    normal."""
    # NOTE: the 0 is the time slice of a field drifting in time (retired at 60fcd8b), kept in
    # the hash so that every stream's noise, and so its replays and save points, stay the same
    key = b"".join(v.to_bytes(16, "little", signed=True) for v in (seed, 0, tx, ty, channels))
    tile_seed = int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") >> 1
    return torch.randn((channels, TILE, TILE), generator=torch.Generator().manual_seed(tile_seed))


def window_noise(seed: int, x: int, y: int, channels: int, size: int) -> torch.Tensor:
    """The field ``seed`` read at latent pixel ``(x, y)`` (top-left, world latent coordinates,
    any sign): ``(channels, size, size)`` float32, standard normal at every pixel and
    independent between pixels; two windows of one seed agree wherever they overlap.
    ValueError for a size or channel count < 1.

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
            out[:, y0 - y : y1 - y, x0 - x : x1 - x] = _tile(seed, tx, ty, channels)[
                :, y0 - ty * TILE : y1 - ty * TILE, x0 - tx * TILE : x1 - tx * TILE
            ]
    return out


def chunk_noise(seed: int, origins: np.ndarray, downsample: int, channels: int,
                size: int) -> torch.Tensor:
    """Initial noise of a chunk whose frames' camera windows sit at ``origins`` (``(F, 2)``
    world image px, top-left ``(x, y)``): ``(F, channels, size, size)`` float32, each frame
    the field read at the latent pixel containing its origin (floor division by
    ``downsample``)."""
    return torch.stack([window_noise(seed, int(ox) // downsample, int(oy) // downsample,
                                     channels, size) for ox, oy in origins])
