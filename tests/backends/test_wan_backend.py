"""The Wan causal WorldBackend on tiny random parts (CPU, fp32): chunks equal an independent
computation with diffusers' full block-causal forward and one-shot VAE decode; prompt switch
recache, fork, rewind, capacity and per-job errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.fixtures.wan import reference_forward, tiny_transformer, tiny_vae
from worldstream.engine.backends.wan.backend import WanBackend, WanConfig
from worldstream.engine.core.api import CapacityError
from worldstream.engine.core.backend import ChunkJob

H = W = 32  # tiny VAE: 4x spatial -> 8x8 latents -> 16 tokens per frame


def fake_encoder(prompt: str) -> torch.Tensor:
    """A deterministic stand-in for UMT5: ``(512, 8)`` states seeded by the prompt."""
    g = torch.Generator().manual_seed(sum(map(ord, prompt)) * 7919)
    return torch.randn(512, 8, generator=g)


def make_backend(**kw) -> WanBackend:
    cfg = WanConfig(height=H, width=W, window_chunks=2, memory_chunks=3, max_states=3,
                    device="cpu", attention_backend="reference", **kw)
    return WanBackend(tiny_transformer(), tiny_vae(), fake_encoder, cfg)


def job(state, seed, steps=1, frames=12):
    return ChunkJob(state, [0] * frames, steps, seed)


def reference_chunk(prev_latents, noise, prompt):
    """One-step chunk from an independent path: diffusers' full forward over
    [clean context at t=0 ; noise at t=1000], x0 = noise - flow."""
    model = tiny_transformer()
    text = fake_encoder(prompt)[None]
    x = torch.cat(prev_latents + [noise], dim=1)[None]
    ts = [0.0] * len(prev_latents) + [1000.0]
    flow = reference_forward(model, x, ts, text, 3)[0, :, -3:]
    return noise - flow


def to_uint8(video):
    return ((video + 1.0) * 127.5).round().clamp(0, 255).to(torch.uint8).permute(1, 2, 3, 0)


def test_chunks_match_independent_reference_and_one_shot_decode():
    be = make_backend()
    state = be.new_state("a red fox in snow", seed=0)
    results = [be.generate([job(state, seed)])[0] for seed in (11, 12, 13)]
    assert all(r.error is None for r in results)
    assert all(r.frames.shape == (12, H, W, 3) and r.frames.dtype == np.uint8 for r in results)
    # the cache fill is deferred until after delivery (the shared runner): finish() times it
    assert set(results[0].stages_ms) == {"denoise", "decode"}
    assert set(be.finish()) == {"cache_fill"}
    be.finish()  # the deferred cache fill appends the chunks to the history
    lat = [c.latents for c in state.history]
    assert [c.position for c in state.history] == [0, 3, 6]
    for n, seed in enumerate((11, 12, 13)):
        noise = torch.randn(be.latent_shape, generator=torch.Generator().manual_seed(seed))
        want = reference_chunk(lat[:n], noise, "a red fox in snow")
        torch.testing.assert_close(lat[n], want, atol=1e-4, rtol=1e-4)
    from worldstream.engine.models.wan.vae_stream import denormalize_latents
    with torch.no_grad():
        video = be.vae.decode(denormalize_latents(be.vae, torch.cat(lat, 1)[None])).sample[0]
    want = to_uint8(video).numpy()  # 9 + 12 + 12 frames; the first frame shown 4 times
    got = np.concatenate([r.frames for r in results])
    assert np.abs(got[3:].astype(int) - want.astype(int)).max() <= 1
    assert (got[:3] == got[3]).all()


def test_prompt_switch_recaches_the_window():
    be = make_backend()
    state = be.new_state("a red fox in snow", seed=0)
    for seed in (1, 2):
        be.generate([job(state, seed)])
    be.set_prompt(state, "a city at night")
    assert state.needs_recache
    be.generate([job(state, 3)])
    be.finish()
    lat = [c.latents for c in state.history]
    noise = torch.randn(be.latent_shape, generator=torch.Generator().manual_seed(3))
    # with every context chunk recached, chunk 2 is as if the whole past had the new prompt
    torch.testing.assert_close(lat[2], reference_chunk(lat[:2], noise, "a city at night"),
                               atol=1e-4, rtol=1e-4)


def test_fork_rewind_free_and_capacity():
    be = make_backend()
    state = be.new_state("waves", seed=0)
    be.generate([job(state, 1)])
    second = be.generate([job(state, 2)])[0].frames
    branch = be.fork(state)
    a, b = be.generate([job(state, 5), job(branch, 5)])
    assert np.array_equal(a.frames, b.frames)  # shared pages and decoder cache
    be.rewind(state, 1)
    again = be.generate([job(state, 5)])[0].frames
    # the rebuilt decoder cache is exact (1 level of rounding: a was decoded in a batch of 2)
    assert np.abs(again.astype(int) - a.frames.astype(int)).max() <= 1
    third = be.new_state("waves", seed=0)
    # NOTE: the state budget is the engine's; the backend's only shortage is the page pool,
    # reported per job
    taken = be.allocator.allocate(be.allocator.num_free())
    short = be.generate([job(third, 1)])[0]
    assert isinstance(short.error, CapacityError) and short.frames is None
    be.allocator.decref(taken)
    with pytest.raises(ValueError, match="cannot rewind"):
        be.rewind(third, 1)
    before = be.allocator.num_free()
    for s in (state, branch, third):
        be.free(s)
        be.free(s)
    assert be.allocator.num_free() == be.allocator.num_pages > before
    assert second.shape == (12, H, W, 3)


def test_errors_are_per_job():
    be = make_backend()
    good, gone = be.new_state("a", seed=0), be.new_state("b", seed=0)
    be.free(gone)
    res = be.generate([job(good, 1), job(good, 1, frames=4), job(gone, 1)])
    assert res[0].error is None and res[0].frames.shape == (12, H, W, 3)
    assert "chunks of 12 frames" in str(res[1].error)
    assert "freed" in str(res[2].error)
    with pytest.raises(ValueError, match="non-empty"):
        be.new_state("  ", seed=0)
    with pytest.raises(ValueError, match="blend weight"):
        be.set_prompt(good, "x", "y", 2.0)


def test_actions_are_ignored():
    be = make_backend()
    s1, s2 = be.new_state("a", seed=0), be.new_state("a", seed=0)
    r1 = be.generate([ChunkJob(s1, [0] * 12, 2, 9)])[0]
    r2 = be.generate([ChunkJob(s2, [3] * 12, 2, 9)])[0]
    assert np.array_equal(r1.frames, r2.frames)


def test_serves_through_the_engine():
    """The engine's sessions, scheduler and frame slots drive the Wan backend unchanged
    (12-frame chunks need a playout buffer of at least 12 frames)."""
    import time

    from worldstream.engine.core.api import PromptCommand
    from worldstream.engine.core.config import EngineConfig
    from worldstream.engine.core.engine import Engine

    be = make_backend()
    config = EngineConfig(fps=60, max_sessions=1, buffer_max_frames=12, batch_join_frames=0,
                          steps=1)
    with Engine(be, config) as engine:
        info = engine.create_session("a quiet harbour", seed=3)
        assert (info.width, info.height) == (W, H)
        slot = engine.subscribe(info.session_id, maxlen=1000)
        frames, deadline, switched = [], time.monotonic() + 60, False
        while len(frames) < 36 and time.monotonic() < deadline:
            frame = slot.get(timeout=0.05)
            if frame is not None:
                frames.append(frame)
            if len(frames) >= 12 and not switched:
                engine.submit(info.session_id, PromptCommand(1, 0.0, "a storm at sea"))
                switched = True
    assert [f.index for f in frames] == list(range(36))
    assert [f.chunk_index for f in frames] == [i // 12 for i in range(36)]
    assert all(f.rgb.shape == (H, W, 3) for f in frames)
    assert frames[-1].prompt_version == 1
    assert {"denoise", "decode"} <= set(frames[-1].stages_ms)  # the cache fill: after delivery


def test_prompts_are_encoded_once_and_blended():
    calls = []

    def counting(prompt):
        calls.append(prompt)
        return fake_encoder(prompt)

    cfg = WanConfig(height=H, width=W, window_chunks=2, memory_chunks=3, max_states=3,
                    device="cpu", attention_backend="reference", text_cache=2)
    be = WanBackend(tiny_transformer(), tiny_vae(), counting, cfg)
    a, b = be.new_state("sunny beach", 0), be.new_state(" sunny beach ", 1)
    assert calls == ["sunny beach"] and a.text is b.text
    be.set_prompt(a, "snowy peak", "sunny beach", 0.25)
    want = 0.75 * be.model.project_text(fake_encoder("snowy peak")[None])[0] \
        + 0.25 * be.model.project_text(fake_encoder("sunny beach")[None])[0]
    torch.testing.assert_close(a.text, want)
    assert calls == ["sunny beach", "snowy peak"]
    # the blend used "sunny beach" last, so "desert" evicts "snowy peak" (least recent)
    be.set_prompt(a, "desert")
    be.set_prompt(a, "sunny beach")
    be.set_prompt(a, "snowy peak")
    assert calls == ["sunny beach", "snowy peak", "desert", "snowy peak"]
