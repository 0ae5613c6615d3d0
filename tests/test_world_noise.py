"""World-anchored noise: windows of one field agree where they overlap, and the field is
standard normal noise (checked against a canvas assembled tile by tile)."""

import numpy as np
import pytest
import torch

from worldstream.engine.models.builtin.world_noise import (
    TILE,
    _tile,
    chunk_noise,
    window_noise,
)


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
    got = chunk_noise(5, origins, [10, 11, 12, 13], 4, 4, 32)  # fixed in time
    assert got.shape == (4, 4, 32, 32)
    torch.testing.assert_close(got[0], got[1], rtol=0, atol=0)  # same latent pixel
    torch.testing.assert_close(got[2][:, :, :-1], got[0][:, :, 1:], rtol=0, atol=0)
    torch.testing.assert_close(got[3], window_noise(5, 2, -1, 4, 32), rtol=0, atol=0)


def test_in_time_the_field_drifts_to_an_independent_one_over_its_period():
    """Frame ``t`` reads ``cos θ · slice k + sin θ · slice k+1`` (``k, r = divmod(t, T)``,
    ``θ = π/2 · r/T``): hand-worked at the slice boundaries and half way, standard normal
    throughout, one frame to the next correlated ``cos(π/2T)``, ``T`` apart ``sin(2θ)/2``
    (one slice shared), independent ``2T`` apart."""
    T, at = 8, np.zeros((1, 2))
    a = [window_noise(2, 0, 0, 4, 32, k) for k in range(3)]
    noise = {t: chunk_noise(2, at, [t], 4, 4, 32, period=T)[0] for t in range(0, 3 * T)}
    torch.testing.assert_close(noise[0], a[0])
    torch.testing.assert_close(noise[T], a[1])  # continuous across the boundary:
    torch.testing.assert_close(noise[2 * T], a[2])
    torch.testing.assert_close(noise[T // 2], (a[0] + a[1]) / 2**0.5)  # θ = π/4
    for t in (0, 3, T + 5):
        assert abs(noise[t].std().item() - 1) < 0.03
    corr = np.corrcoef(noise[3].flatten(), noise[4].flatten())[0, 1]
    assert abs(corr - np.cos(np.pi / (2 * T))) < 0.02
    shared = np.corrcoef(noise[2].flatten(), noise[T + 2].flatten())[0, 1]
    assert abs(shared - np.sin(2 * np.pi / 2 * 2 / T) / 2) < 0.05
    assert abs(np.corrcoef(noise[2].flatten(), noise[2 * T + 2].flatten())[0, 1]) < 0.05


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="channels and size"):
        window_noise(0, 0, 0, 0, 8)
    with pytest.raises(ValueError, match="channels and size"):
        window_noise(0, 0, 0, 4, 0)
    with pytest.raises(ValueError, match="period"):
        chunk_noise(0, np.zeros((1, 2)), [0], 4, 4, 8, period=-1)
