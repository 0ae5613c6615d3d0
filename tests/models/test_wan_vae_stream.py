"""Streaming decode of a tiny AutoencoderKLWan equals its one-shot ``decode``."""

from __future__ import annotations

import pytest
import torch

from tests.fixtures.wan import Z, tiny_vae
from worldstream.engine.models.wan.vae_stream import (
    decode_stream,
    denormalize_latents,
    new_decode_cache,
)


@pytest.fixture(scope="module")
def vae():
    return tiny_vae()


def test_chunked_stream_equals_one_shot_decode(vae):
    torch.manual_seed(3)
    z = torch.randn(2, Z, 7, 4, 4)  # two streams, chunks of 3, 3, 1 latent frames
    with torch.no_grad():
        want = vae.decode(z).sample
    caches = [new_decode_cache(vae) for _ in range(2)]
    parts = [decode_stream(vae, z[:, :, a:b], caches) for a, b in [(0, 3), (3, 6), (6, 7)]]
    assert [p.shape[2] for p in parts] == [9, 12, 4]  # 1 + 4*2, then 4 per latent frame
    got = torch.cat(parts, dim=2)
    assert got.shape == want.shape == (2, 3, 25, 16, 16)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_streams_in_one_batch_are_independent_and_snapshots_rewind(vae):
    torch.manual_seed(4)
    z = torch.randn(2, Z, 6, 4, 4)
    alone = new_decode_cache(vae)
    first = decode_stream(vae, z[:1, :, :3], [alone])
    snap = alone.snapshot()
    second = decode_stream(vae, z[:1, :, 3:], [alone])
    # the same stream decoded batched with another one
    pair = [new_decode_cache(vae), new_decode_cache(vae)]
    decode_stream(vae, z[:, :, :3], pair)
    torch.testing.assert_close(decode_stream(vae, z[:, :, 3:], pair)[:1], second,
                               atol=1e-5, rtol=1e-5)
    # decoding from the snapshot again gives the same frames (entries are never mutated)
    torch.testing.assert_close(decode_stream(vae, z[:1, :, 3:], [snap]), second, atol=0, rtol=0)
    assert first.shape[2] == 9


def test_restarting_the_cache_differs(vae):
    """Without the kept cache (what per-chunk ``decode`` does) the second chunk changes."""
    torch.manual_seed(5)
    z = torch.randn(1, Z, 6, 4, 4)
    with torch.no_grad():
        full = vae.decode(z).sample
        restarted = vae.decode(z[:, :, 3:]).sample
    assert (full[:, :, -4:] - restarted[:, :, -4:]).abs().max() > 1e-3


def test_mixed_phases_and_counts_refused(vae):
    started = new_decode_cache(vae)
    decode_stream(vae, torch.randn(1, Z, 1, 4, 4), [started])
    with pytest.raises(ValueError, match="separate calls"):
        decode_stream(vae, torch.randn(2, Z, 1, 4, 4), [started, new_decode_cache(vae)])
    with pytest.raises(ValueError, match="caches for a batch"):
        decode_stream(vae, torch.randn(2, Z, 1, 4, 4), [started])


def test_denormalize_matches_pipeline_formula(vae):
    z = torch.randn(1, Z, 2, 3, 3)
    mean = torch.tensor(vae.config.latents_mean).view(1, Z, 1, 1, 1)
    inv_std = 1.0 / torch.tensor(vae.config.latents_std).view(1, Z, 1, 1, 1)
    torch.testing.assert_close(denormalize_latents(vae, z), z / inv_std + mean)
