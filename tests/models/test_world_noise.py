"""World-anchored noise: windows of one field agree where they overlap, and the field is
standard normal noise (checked against a canvas assembled tile by tile)."""

import numpy as np
import pytest
import torch

from worldstream.engine.models.builtin.world_noise import TILE, _tile, chunk_noise, window_noise


def canvas(seed: int, x0: int, y0: int, tiles: int, channels: int) -> torch.Tensor:
    """The field over ``tiles × tiles`` whole tiles from tile ``(x0, y0)``, pasted tile by
    tile: the reference any window must be a crop of."""
    rows = [torch.cat([_tile(seed, x0 + i, y0 + j, channels) for i in range(tiles)], dim=2)
            for j in range(tiles)]
    return torch.cat(rows, dim=1)


@pytest.mark.parametrize("x,y,size", [(0, 0, 32), (5, 9, 32), (-21, -3, 32), (-16, 17, 7),
                                      (31, -40, 1), (3, 3, 40)])
def test_a_window_is_the_crop_of_the_field_at_its_position(x, y, size):
    ref = canvas(11, -4, -4, 8, 4)  # latent px -64 .. 63 each way
    got = window_noise(11, x, y, 4, size)
    want = ref[:, y + 4 * TILE : y + 4 * TILE + size, x + 4 * TILE : x + 4 * TILE + size]
    assert got.shape == (4, size, size)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_the_field_is_white_standard_normal_noise_of_its_seed():
    a = window_noise(3, -100, 40, 4, 256)
    assert abs(a.mean().item()) < 0.01 and abs(a.std().item() - 1) < 0.01
    # neighbouring pixels, across and within tiles, and channels are uncorrelated
    for u, v in ((a[:, :, 1:], a[:, :, :-1]), (a[:, 1:], a[:, :-1]), (a[0], a[1])):
        assert abs(np.corrcoef(u.flatten(), v.flatten())[0, 1]) < 0.02
    b = window_noise(4, -100, 40, 4, 256)
    assert abs(np.corrcoef(a.flatten(), b.flatten())[0, 1]) < 0.02  # another seed, another field
    assert not torch.equal(_tile(3, 0, 0, 4), _tile(3, 1, 0, 4))


def test_chunk_noise_reads_each_frame_at_the_latent_pixel_of_its_origin():
    origins = np.array([[0, 0], [3, 0], [4, 0], [9, -1]])  # world image px, 4 px a latent px
    got = chunk_noise(5, origins, 4, 4, 32)
    assert got.shape == (4, 4, 32, 32)
    torch.testing.assert_close(got[0], got[1], rtol=0, atol=0)  # same latent pixel
    torch.testing.assert_close(got[2][:, :, :-1], got[0][:, :, 1:], rtol=0, atol=0)
    torch.testing.assert_close(got[3], window_noise(5, 2, -1, 4, 32), rtol=0, atol=0)


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="channels and size"):
        window_noise(0, 0, 0, 0, 8)
    with pytest.raises(ValueError, match="channels and size"):
        window_noise(0, 0, 0, 4, 0)


def test_the_field_hashes_tiles_as_it_always_has():
    """A tile's generator seed is blake2b of (seed, 0, tx, ty, channels), each 16 bytes little
    endian, shifted right by one: recomputed here by hand, so streams, replays and save points
    keep their noise."""
    import hashlib

    key = b"".join(v.to_bytes(16, "little", signed=True) for v in (7, 0, -2, 3, 4))
    tile_seed = int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") >> 1
    want = torch.randn((4, TILE, TILE), generator=torch.Generator().manual_seed(tile_seed))
    torch.testing.assert_close(_tile(7, -2, 3, 4), want, rtol=0, atol=0)
