"""The built-in backend's streaming path against one dense block-causal forward over the whole
stream (tiny random models, CPU, fp32): the paged KV cache, cache fill, spatial-memory bases,
batching and dtypes."""

import numpy as np
import pytest
import torch

from tests.fixtures.builtin import F, seeded_noise, tiny_generator, window_mask
from worldstream.engine.core.backend import ChunkJob
from worldstream.engine.models.builtin.attention import DenseContext, expand_frame_mask
from worldstream.engine.models.builtin.autoencoder import build_autoencoder
from worldstream.engine.worlds.actions import action_to_direction


@pytest.mark.parametrize(
    "window,sink,noise,world_noise,pose",
    [(2, False, False, True, None), (2, True, True, False, None),
     (8, False, False, True, None), (2, True, False, False, "head_rig_fit"),
     (2, False, True, True, None)],
)
def test_cached_generation_equals_dense_block_causal_forward(window, sink, noise, world_noise,
                                                             pose):
    """The streaming path (paged KV cache, cache fill, spatial memory feeding every frame its
    base; with ``pose_path`` the rig's pose)
    computes what one dense block-causal forward over the whole stream computes; the initial
    noise is the job seed's world field at each frame's window, or fresh noise."""
    gen = tiny_generator(pose, window_chunks=window, sink=sink,
                         memory_chunks=max(window, 3), ctx_noise=noise, world_noise=world_noise)
    state = gen.new_state("a green meadow", seed=3)
    rng = np.random.default_rng(0)
    actions = [list(rng.integers(0, 9, F)) for _ in range(6)]
    for n, act in enumerate(actions):
        (res,) = gen.generate([ChunkJob(state, [int(a) for a in act], steps=1, seed=100 + n)])
        assert res.error is None and res.frames.shape == (F, 128, 128, 3)
    gen.finish()  # the last chunk's cache fill runs after delivery
    records = list(state.history)  # bounded: older chunks were evicted
    m = gen.model
    # the same stream with unbounded memory keeps every chunk's inputs for the reference
    gen2 = tiny_generator(pose, window_chunks=window, sink=sink, memory_chunks=16,
                          ctx_noise=noise, world_noise=world_noise)
    st2 = gen2.new_state("a green meadow", seed=3)
    for n, act in enumerate(actions):
        gen2.generate([ChunkJob(st2, [int(a) for a in act], steps=1, seed=100 + n)])
    gen2.finish()
    recs = list(st2.history)
    assert len(recs) == 7
    # memory is in play: after the start chunk every frame's base holds remembered ground
    assert all(r.known[:, 0].mean() > 0.5 for r in recs[1:])
    if pose:  # the head eased toward each frame's held direction, a quarter of the gap
        yaw_pitch, want = np.zeros(2), []
        for a in [a for r in recs for a in r.actions]:
            dx, dy = action_to_direction(a % 9)
            yaw_pitch = yaw_pitch + 0.25 * (np.array([dx, dy]) - yaw_pitch)
            want.append(yaw_pitch)
        assert np.allclose(np.concatenate([r.poses for r in recs]), want)
    n_chunks = len(recs)
    text = torch.as_tensor(st2.text)[None, None].expand(1, n_chunks * F, -1)
    mask = expand_frame_mask(window_mask(n_chunks, window, sink), m.tokens_per_frame)
    for last in range(1, n_chunks):
        noise = seeded_noise(gen, 100 + last - 1, recs[last])
        seq = torch.cat([r.context for r in recs[:last]] + [noise])[None]
        k = (last + 1) * F
        sigma = torch.full((1, k), gen.config.ctx_sigma)
        sigma[:, -F:] = 1.0
        with torch.no_grad():
            out = m(
                seq,
                torch.cat([r.base for r in recs[: last + 1]])[None],
                torch.full((1, k), gen.config.ctx_sigma),
                torch.cat([r.known for r in recs[: last + 1]])[None],
                sigma,
                torch.tensor([a for r in recs[: last + 1] for a in r.actions])[None],
                text[:, :k],
                torch.arange(k)[None],
                DenseContext(mask[: k * 64, : k * 64]),
                skip=None,
                pose=(torch.as_tensor(np.concatenate([r.poses for r in recs[: last + 1]]),
                                      dtype=torch.float32)[None] if pose else None),
            )
        got = recs[last].latents
        assert torch.allclose(out[0, -F:], got, atol=1e-4), (last, (out[0, -F:] - got).abs().max())
    # the first run (bounded memory, eviction) produced the same chunks as the unbounded one
    for a, b in zip(records, recs[-len(records) :]):
        assert torch.allclose(a.latents, b.latents, atol=1e-5)


def test_last_step_cache_equals_the_dense_forward_over_noisy_context():
    """``last_step_cache_sigma``: at 4 steps (last σ = 0.25) no cache fill runs, and every
    later chunk attends what one dense block-causal forward computes with each earlier chunk
    as the input of its own last step, tagged that step's σ; at 2 steps (last σ = 0.5, above
    the setting) the fill still runs."""
    for steps, fills in ((4, False), (2, True)):
        gen = tiny_generator(last_step_cache_sigma=0.3, window_chunks=8, memory_chunks=8)
        calls = []  # (x, σ, output) of every forward
        forward = gen.forward

        def spy(x, sigma, cond, ctx, forward=forward, calls=calls):
            out = forward(x, sigma, cond, ctx)
            calls.append((x.clone(), sigma, out.clone()))
            return out

        gen.forward = spy
        state = gen.new_state("a green meadow", seed=3)
        rng = np.random.default_rng(0)
        for n in range(4):
            act = [int(a) for a in rng.integers(0, 9, F)]
            (res,) = gen.generate([ChunkJob(state, act, steps=steps, seed=100 + n)])
            assert res.error is None
        gen.finish()
        # the start chunk's fill, then each chunk's steps (and its fill)
        assert calls[0][1] == gen.config.ctx_sigma
        assert len(calls) == 1 + 4 * (steps + fills)
        if fills:
            continue
        recs, m = list(state.history), gen.model
        last_inputs = [calls[1 + steps * n + steps - 1] for n in range(4)]
        assert all(sigma == pytest.approx(0.25) for _, sigma, _ in last_inputs)
        k_all = len(recs) * F
        text = torch.as_tensor(state.text)[None, None].expand(1, k_all, -1)
        mask = expand_frame_mask(window_mask(len(recs), 8, False), m.tokens_per_frame)
        for last in range(1, len(recs)):
            x, _, want = last_inputs[last - 1]
            seq = torch.cat([recs[0].context] + [c[0][0] for c in last_inputs[: last - 1]]
                            + [x[0]])[None]
            k = (last + 1) * F
            sigma = torch.full((1, k), 0.25)
            sigma[:, :F] = gen.config.ctx_sigma  # the start chunk was cache-filled
            with torch.no_grad():
                out = m(seq, torch.cat([r.base for r in recs[: last + 1]])[None],
                        torch.full((1, k), gen.config.ctx_sigma),
                        torch.cat([r.known for r in recs[: last + 1]])[None], sigma,
                        torch.tensor([a for r in recs[: last + 1] for a in r.actions])[None],
                        text[:, :k], torch.arange(k)[None],
                        DenseContext(mask[: k * 64, : k * 64]))
            assert torch.allclose(out[0, -F:], want[0], atol=1e-4), (
                last, (out[0, -F:] - want[0]).abs().max())


def test_batched_sessions_equal_one_at_a_time():
    gen = tiny_generator()
    prompts = ["a snowy forest", "hot desert dunes seen from above", "a dark landscape at night"]
    states = [gen.new_state(p, seed=i) for i, p in enumerate(prompts)]
    solo = []
    for i, s in enumerate(states):
        frames = []
        for n in range(3):
            (r,) = gen.generate([ChunkJob(s, [i, 8 - i], steps=2, seed=10 * i + n)])
            frames.append(r.frames)
        solo.append(np.concatenate(frames))
    gen2 = tiny_generator()
    states2 = [gen2.new_state(p, seed=i) for i, p in enumerate(prompts)]
    batched = [[] for _ in states2]
    for n in range(3):
        res = gen2.generate(
            [ChunkJob(s, [i, 8 - i], steps=2, seed=10 * i + n) for i, s in enumerate(states2)]
        )
        for i, r in enumerate(res):
            batched[i].append(r.frames)
    for a, b in zip(solo, batched):
        assert np.abs(a.astype(int) - np.concatenate(b).astype(int)).max() <= 1
    gen.finish()
    gen2.finish()
    for a, b in zip(states, states2):
        assert torch.allclose(a.history[-1].latents, b.history[-1].latents, atol=1e-4)


def test_bf16_generation_runs_and_tracks_fp32():
    outs = {}
    for dtype in (torch.float32, torch.bfloat16):
        gen = tiny_generator(dtype=dtype)
        s = gen.new_state("a green meadow", seed=1)
        for n in range(2):
            (r,) = gen.generate([ChunkJob(s, [5, 5], steps=2, seed=n)])
            assert r.error is None
        outs[dtype] = s.history[-1].latents.float()
    err = (outs[torch.float32] - outs[torch.bfloat16]).abs().mean()
    assert err < 0.05 * outs[torch.float32].abs().mean()


def test_channels_last_autoencoder_codes_as_the_default_layout():
    """The backend keeps its autoencoder in channels-last layout (for speed); encoding and
    decoding must give what the same weights give in the default NCHW layout."""
    gen = tiny_generator()
    assert all(p.is_contiguous(memory_format=torch.channels_last)
               for p in gen.ae.parameters() if p.dim() == 4)
    plain = build_autoencoder(width=8)
    plain.load_state_dict(gen.ae.state_dict())
    plain = plain.to(gen.ae_dtype).eval()
    frames = np.random.default_rng(0).integers(0, 256, (2, 128, 128, 3), dtype=np.uint8)
    latents = gen.encode_frames(frames)
    with torch.no_grad():
        x = torch.as_tensor(frames).permute(0, 3, 1, 2).float().div(127.5).sub(1.0)
        want = gen.model.normalize(plain.encoder(x.contiguous().to(gen.ae_dtype)).float())
        decoded = plain.decoder(gen.model.denormalize(latents).to(gen.ae_dtype)).float()
    torch.testing.assert_close(latents, want, atol=2e-3, rtol=1e-2)
    want_rgb = decoded.clamp(-1, 1).add(1).mul(127.5).round().to(torch.uint8).permute(0, 2, 3, 1)
    got_rgb = torch.as_tensor(gen.decode_latents(latents))
    assert (got_rgb.int() - want_rgb.int()).abs().max() <= 1
