"""The Wan chunk forward through the paged KV cache equals diffusers' own full forward with a
block-causal mask (tiny random WanTransformer3DModel, fp32, CPU)."""

from __future__ import annotations

import pytest
import torch

from tests.fixtures.wan import reference_forward, tiny_transformer
from worldstream.engine.backends.builtin import PagedAttentionContext
from worldstream.engine.core.kv_cache import PageAllocator
from worldstream.engine.models.wan.model import WanChunkModel


def chunked_forward(runner, latents, chunk_t, text, chunk_frames, scramble=0):
    b, c, f, h, w = latents.shape
    page = runner.tokens_per_frame(h, w)
    alloc = PageAllocator(64)
    alloc.allocate(scramble)  # so the sessions' pages do not start at 0
    shape = (runner.num_layers, 64, runner.num_heads, page, runner.head_dim)
    k_pool, v_pool = torch.zeros(shape), torch.zeros(shape)
    history = [[] for _ in range(b)]
    outs = []
    text_proj = runner.project_text(text)
    for i, start in enumerate(range(0, f, chunk_frames)):
        pages = [alloc.allocate(chunk_frames) for _ in range(b)]
        new = torch.tensor([p for ps in pages for p in ps])
        ctx = PagedAttentionContext(k_pool, v_pool, new, [hs + ps for hs, ps in
                                                          zip(history, pages, strict=True)],
                                    [[] for _ in range(b)], 0, "reference")
        outs.append(runner.forward_chunk(latents[:, :, start:start + chunk_frames],
                                         torch.full((b,), float(chunk_t[i])), text_proj,
                                         torch.full((b,), start), ctx))
        for hs, ps in zip(history, pages, strict=True):
            hs.extend(ps)
    return torch.cat(outs, dim=2)


@pytest.mark.parametrize("batch,scramble", [(1, 0), (2, 5)])
def test_chunked_paged_equals_block_causal_full_forward(batch, scramble):
    model = tiny_transformer()
    torch.manual_seed(1)
    latents = torch.randn(batch, 4, 9, 4, 6)
    text = torch.randn(batch, 5, 8)
    chunk_t = [0.0, 250.0, 937.5]
    want = reference_forward(model, latents, chunk_t, text, 3)
    got = chunked_forward(WanChunkModel(model), latents, chunk_t, text, 3, scramble)
    assert got.shape == want.shape == latents.shape
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_later_chunks_see_earlier_ones_not_later():
    """Changing chunk 1 changes chunk 2's output but not chunk 0's (causality holds and the
    cache is actually read)."""
    runner = WanChunkModel(tiny_transformer())
    torch.manual_seed(2)
    latents = torch.randn(1, 4, 9, 4, 4)
    text = torch.randn(1, 5, 8)
    base = chunked_forward(runner, latents, [0, 0, 500], text, 3)
    latents2 = latents.clone()
    latents2[:, :, 3:6] += 1.0
    other = chunked_forward(runner, latents2, [0, 0, 500], text, 3)
    torch.testing.assert_close(other[:, :, :3], base[:, :, :3], atol=0, rtol=0)
    assert (other[:, :, 6:] - base[:, :, 6:]).abs().max() > 1e-3


def test_plain_forward_after_install_raises():
    model = tiny_transformer()
    WanChunkModel(model)
    with pytest.raises(RuntimeError, match="outside a chunk forward"):
        with torch.no_grad():
            model(torch.randn(1, 4, 3, 4, 4), torch.tensor([10.0]), torch.randn(1, 5, 8))
