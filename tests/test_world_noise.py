"""World-anchored noise: windows of one field agree where they overlap, and the field is
standard normal noise (checked against a canvas assembled tile by tile); its low-passed share
keeps unit variance and has the Gaussian autocorrelation worked out by hand."""

import numpy as np
import pytest
import torch

from worldstream.engine.models.builtin.world_noise import (
    LOW_PASS_SLICE,
    TILE,
    _tile,
    chunk_noise,
    correlated,
    low_pass,
    noise_margin,
    training_noise,
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


def neighbour_corr(a: torch.Tensor, d: int) -> float:
    """Correlation of pixels ``d`` apart along the last axis of ``a``."""
    return float(np.corrcoef(a[..., d:].flatten(), a[..., :-d].flatten())[0, 1])


def test_low_pass_of_a_delta_is_its_unit_norm_gaussian_kernel():
    s = 2.0
    m = noise_margin(s)
    assert m == 6
    wide = torch.zeros(1, 2 * m + 5, 2 * m + 5)
    wide[0, m + 2, m + 2] = 1.0  # one pixel in the middle of a 5 x 5 inside
    out = low_pass(wide, s)
    assert out.shape == (1, 5, 5)
    x = np.arange(-m, m + 1)
    g = np.exp(-0.5 * (x / s) ** 2)
    g /= np.sqrt((g ** 2).sum())
    want = np.outer(g, g)[m - 2 : m + 3, m - 2 : m + 3]  # the kernel around its centre
    np.testing.assert_allclose(out[0].numpy(), want, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("scale", [1.0, 2.0])
def test_low_passed_white_noise_is_standard_normal_with_gaussian_autocorrelation(scale):
    """A Gaussian blur of std ``s`` turns white noise's autocorrelation into a Gaussian of
    std ``s·√2``: pixels ``d`` apart correlate ``exp(−d²/4s²)``."""
    m = noise_margin(scale)
    out = low_pass(torch.randn(64, 64 + 2 * m, 64 + 2 * m,
                               generator=torch.Generator().manual_seed(0)), scale)
    assert abs(out.std().item() - 1) < 0.03 and abs(out.mean().item()) < 0.03
    for d in (1, 2, 4):
        assert abs(neighbour_corr(out, d) - np.exp(-d * d / (4 * scale * scale))) < 0.03


def test_correlated_noise_mixes_white_and_low_passed_by_share_of_variance():
    c, s = 0.3, 2.0
    got = training_noise((64, 4, 32, 32), torch.Generator().manual_seed(1), c, s)
    assert got.shape == (64, 4, 32, 32)
    assert abs(got.std().item() - 1) < 0.03
    assert abs(neighbour_corr(got, 1) - c * np.exp(-1 / 16)) < 0.03
    assert abs(neighbour_corr(got, 4) - c * np.exp(-1.0)) < 0.03
    white = torch.randn(2, 8, 8)
    assert correlated(white, torch.randn(2, 20, 20), 0.0, s) is white  # 0: white unchanged
    # 0: the same draws as torch.randn, so a model trained on white noise streams as before
    shape = (3, 4, 8, 8)
    torch.testing.assert_close(training_noise(shape, torch.Generator().manual_seed(5), 0.0, s),
                               torch.randn(shape, generator=torch.Generator().manual_seed(5)))


def test_correlated_chunk_noise_sits_on_the_ground_and_matches_the_hand_mix():
    c, s = 0.5, 2.0
    origins = np.array([[0, 0], [8, 4]])  # the second window 2 latent px right, 1 down
    got = chunk_noise(9, origins, [0, 1], 4, 4, 32, correlation=c, scale=s)
    torch.testing.assert_close(got[1][:, :-1, :-2], got[0][:, 1:, 2:], rtol=0, atol=1e-6)
    m = noise_margin(s)
    want = (np.sqrt(1 - c) * window_noise(9, 0, 0, 4, 32)
            + np.sqrt(c) * low_pass(window_noise(9, -m, -m, 4, 32 + 2 * m, LOW_PASS_SLICE), s))
    torch.testing.assert_close(got[0], want.float(), rtol=0, atol=1e-6)
    torch.testing.assert_close(chunk_noise(9, origins, [0, 1], 4, 4, 32, correlation=0.0),
                               chunk_noise(9, origins, [0, 1], 4, 4, 32), rtol=0, atol=0)


def test_bad_correlations_and_scales_are_refused():
    for c in (-0.1, 1.0):
        with pytest.raises(ValueError, match="correlation"):
            chunk_noise(0, np.zeros((1, 2)), [0], 4, 4, 8, correlation=c)
        with pytest.raises(ValueError, match="correlation"):
            correlated(torch.zeros(8, 8), torch.zeros(20, 20), c, 2.0)
    with pytest.raises(ValueError, match="scale"):
        low_pass(torch.zeros(20, 20), 0.0)
    with pytest.raises(ValueError, match="no inside"):
        low_pass(torch.zeros(12, 12), 2.0)
