"""The neural backend against independent references (tiny random models, CPU, fp32)."""

import shutil

import numpy as np
import pytest
import torch

from worldstream.engine.backends.builtin import BuiltinBackend, BuiltinConfig, compositing, guidance
from worldstream.engine.backends.builtin import noise as noise_stage
from worldstream.engine.backends.builtin import pages as pages_stage
from worldstream.engine.backends.builtin.colour import anchor_colour
from worldstream.engine.backends.builtin.compositing import (
    detail_gain,
    residual_weight,
    shading_detail,
    shrink_change,
)
from worldstream.engine.backends.builtin.pages import attended
from worldstream.engine.backends.stages import replace_stage
from worldstream.engine.core.backend import ChunkJob
from worldstream.engine.models.builtin import attention
from worldstream.engine.models.builtin.attention import DenseContext, expand_frame_mask
from worldstream.engine.models.builtin.autoencoder import build_autoencoder
from worldstream.engine.models.builtin.colour_prior import ColourPrior
from worldstream.engine.models.builtin.spatial_memory import centre_box, model_inputs
from worldstream.engine.models.builtin.world_dit import WorldDiT
from worldstream.engine.models.builtin.world_noise import chunk_noise
from worldstream.engine.worlds.actions import IDLE, action_to_direction
from worldstream.engine.worlds.simulator import ACCEL, FRICTION, WorldSimulator

F = 2  # frames per chunk


def tiny_generator(pose_path: str | None = None, **cfg) -> BuiltinBackend:
    torch.manual_seed(0)
    model = WorldDiT(dim=64, depth=2, num_heads=2, chunk_frames=F, pose_path=pose_path)
    # adaLN-Zero starts as the identity; randomise it so that every path matters
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    cfg.setdefault("attention_backend", "reference")
    # the dense references below are unguided full schedules; steady prompt guidance, the
    # first step from memory and the colour anchor have their own tests
    cfg.setdefault("steady_guidance_sigma", None)
    cfg.setdefault("first_step_from_memory", None)
    cfg.setdefault("colour_anchor", None)
    return BuiltinBackend(model, build_autoencoder(width=8), BuiltinConfig(**cfg))


def exact_camera(camera) -> None:
    """Set camera dynamics to the simulator's own (``v' = F·(v + A·d)``, linear part only)."""
    with torch.no_grad():
        camera.mlp[2].weight.zero_()
        camera.mlp[2].bias.zero_()
        camera.linear.bias.zero_()
        w = torch.zeros(2, 2 + 9)
        w[:, :2] = (FRICTION - 1) * torch.eye(2)
        for a in range(9):
            d = torch.tensor(action_to_direction(a), dtype=torch.float32)
            w[:, 2 + a] = FRICTION * ACCEL * d / max(d.norm(), 1e-9)
        camera.linear.weight.copy_(w)


def seeded_noise(gen: BuiltinBackend, seed: int, record) -> torch.Tensor:
    """The initial noise ``(F, C, h, w)`` of a chunk generated with ``ChunkJob(seed=seed)``
    whose frames' windows sit at ``record.origins``: the seed's world field read at each
    window's latent pixel (``world_noise``), else one draw of a generator seeded ``seed``."""
    mc = gen.model.config
    g, c = mc.latent_size, mc.latent_channels
    if not gen.config.world_noise:
        return torch.randn((F, c, g, g), generator=torch.Generator().manual_seed(seed))
    return chunk_noise(seed, record.origins, record.field_times, gen.downsample, c, g)


def window_mask(num_chunks: int, window: int, sink: bool) -> torch.Tensor:
    """Chunk i attends chunk j iff i - window <= j <= i (or j == 0 with a sink)."""
    i = torch.arange(num_chunks)[:, None]
    j = torch.arange(num_chunks)[None, :]
    mask = (j <= i) & (j >= i - window)
    if sink:
        mask |= j == 0
    return mask.repeat_interleave(F, 0).repeat_interleave(F, 1)


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
        forward = gen._forward

        def spy(x, sigma, cond, ctx, forward=forward, calls=calls):
            out = forward(x, sigma, cond, ctx)
            calls.append((x.clone(), sigma, out.clone()))
            return out

        gen._forward = spy
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


def record_sigmas(gen: BuiltinBackend) -> list[float]:
    """The noise level of every forward ``gen`` runs from now on, in order (a spy on
    ``_forward``)."""
    sigmas: list[float] = []
    forward = gen._forward

    def spy(x, sigma, cond, ctx):
        sigmas.append(sigma)
        return forward(x, sigma, cond, ctx)

    gen._forward = spy
    return sigmas


def test_first_step_from_memory_is_a_first_prediction_of_the_memory_base(monkeypatch):
    """``first_step_from_memory``: a 4-step chunk runs 3 forwards, none at σ = 1, and streams
    what the full schedule streams when the model's σ = 1 prediction is the chunk's memory
    base; a prompt switch's guided chunks run all 4 steps, and so do chunks whose view holds
    ground remembered under the old prompt (stale) and chunks of fewer steps than the
    setting."""
    fast = tiny_generator(first_step_from_memory=4, guidance_chunks=2)
    full = tiny_generator(first_step_from_memory=None, guidance_chunks=2)
    sigmas = record_sigmas(fast)
    guided_forward = guidance.guided_forward

    long_chunk = [True]  # the chunk being generated has >= 4 steps

    def base_at_one(backend, x, sigma, cond, ctx):  # outside guided chunks, nothing stale
        known, guided = cond[2], cond[6]
        if backend is full and sigma == 1.0 and long_chunk[0] and not (
                bool(guided.any()) or bool(known[:, :, 1].any())):
            return cond[0].to(x.dtype)
        return guided_forward(backend, x, sigma, cond, ctx)

    monkeypatch.setattr(guidance, "guided_forward", base_at_one)
    states = [g.new_state("a green meadow", seed=3) for g in (fast, full)]
    rng = np.random.default_rng(1)
    for n, steps in enumerate([4, 4, 2, 4, 4, 4]):
        if n == 3:
            for g, st in zip((fast, full), states):
                g.set_prompt(st, "a snowy forest")
        act = [int(a) for a in rng.integers(0, 9, F)]
        before, long_chunk[0] = len(sigmas), steps >= 4
        outs = [g.generate([ChunkJob(st, act, steps=steps, seed=10 + n)])[0]
                for g, st in zip((fast, full), states)]
        for g in (fast, full):
            g.finish()
        assert all(o.error is None for o in outs)
        steps_run = [s for s in sigmas[before:] if s != fast.config.ctx_sigma]
        full_schedule = [1.0, 0.5] if steps == 2 else [1.0, 0.75, 0.5, 0.25]
        stale = bool(states[0].history[-1].known[:, 1].any())
        assert stale == (n >= 3), n  # the old prompt's ground stays in view after the switch
        assert steps_run == (full_schedule if n in (2, 3, 4, 5) else full_schedule[1:]), n
        assert torch.allclose(states[0].history[-1].latents, states[1].history[-1].latents,
                              atol=1e-5), n
        assert np.abs(outs[0].frames.astype(int) - outs[1].frames).max() <= 1, n


def test_step_cost_counts_the_forwards_of_a_chunk():
    """``step_cost`` (the engine's degradation reads it) equals the forwards a chunk runs
    before its frames are shown, counted: with the first step from memory (the landscape's
    default) 4 steps cost 3, as many as 3 steps; 2 steps 2, 1 step 1 (their cache fills run
    after delivery, in ``finish``)."""
    gen = tiny_generator(first_step_from_memory=4, last_step_cache_sigma=0.3)
    sigmas = record_sigmas(gen)
    state = gen.new_state("a green meadow", seed=3)
    gen.generate([ChunkJob(state, [0] * F, steps=2, seed=0)])
    counted = {}
    for steps in (4, 3, 2, 1, 4):
        gen.finish()  # the previous chunk's deferred fill, if any
        before = len(sigmas)
        gen.generate([ChunkJob(state, [5] * F, steps=steps, seed=steps)])
        counted[steps] = len(sigmas) - before
    assert counted == {4: 3, 3: 3, 2: 2, 1: 1}
    assert {s: gen.step_cost(s) for s in counted} == counted


def test_first_step_from_memory_needs_two_steps():
    with pytest.raises(ValueError, match="first_step_from_memory"):
        BuiltinConfig(first_step_from_memory=1)


def test_a_key_from_rest_moves_the_first_frame_by_the_nearest_pixel():
    """The stream's frames are windows at whole pixels of the camera path: at the nearest
    pixel (the path starts half a pixel in), so the first frame after a key from rest shows
    the simulator's first step of 0.94 px (a window at the floor of a path starting at 0 did
    not move until the second frame)."""
    gen = tiny_generator()
    exact_camera(gen.model.camera)
    state = gen.new_state("a green meadow", seed=3)
    right = 5
    assert action_to_direction(right) == (1, 0)
    (res,) = gen.generate([ChunkJob(state, [right] * F, steps=1, seed=0)])
    gen.finish()  # the deferred cache fill appends the chunk to the history
    assert res.error is None
    start = state.history[0].origins[-1]
    x, v, expected = 0.0, 0.0, []
    for _ in range(F):  # the simulator's camera, by hand
        v = (v + ACCEL) * FRICTION
        x += v
        expected.append(int(np.floor(x + 0.5)))
    assert expected[0] == 1
    assert (state.history[-1].origins - start).tolist() == [[e, 0] for e in expected]


def test_start_frames_stay_in_memory_where_generated_frames_see_them_better():
    """The start frames are real: moving right, the generated frames see the start window's
    right border columns farther from their own border than the start frames did, and still
    do not rewrite them (a loop back to the start reads the start picture); the ground they
    reveal beyond it is written."""
    start = np.random.default_rng(0).integers(0, 256, (F, 128, 128, 3), dtype=np.uint8)
    gen = tiny_generator()
    exact_camera(gen.model.camera)
    state = gen.new_state("a green meadow", seed=3, start_frames=start)
    for seed in range(3):
        (res,) = gen.generate([ChunkJob(state, [5] * F, steps=1, seed=seed)])  # right
        gen.finish()
        assert res.error is None
    x0, y0 = state.history[0].origins[0]
    assert state.history[-1].origins[-1][0] - x0 >= 4  # moved on by a few pixels
    kept = ~centre_box(128, gen.model.config.view_box)
    # the newest start frame (real frames overwrite each other; generated ones do not)
    np.testing.assert_array_equal(state.memory.read(x0, y0, 128).rgb[kept], start[-1][kept])
    beyond = state.memory.read(x0 + 128, y0, 4)
    assert beyond.current[:, :2].all()


def test_shrink_change_hand_worked():
    change = np.array([[10, -4, 2], [-5, 3, 0], [300, 0, -300]], np.int16)
    # largest channel 10 -> 10 - 6 = 4: scale 0.4; 5 -> 0; 300 -> 294: scale 0.98
    assert shrink_change(change, 6).tolist() == [[4, -2, 1], [0, 0, 0], [294, 0, -294]]
    assert shrink_change(change, 0).tolist() == change.tolist()


def test_residual_weight_hand_worked():
    """1 at or under t1, 0 at or over t2, linear between, on each pixel's largest channel
    averaged over the 5 x 5 square around it."""
    def uniform(value):
        change = np.zeros((1, 9, 9, 3), np.int16)
        change[..., 1] = value
        change[..., 0] = value // 4  # smaller channels do not count
        return change

    assert np.allclose(residual_weight(uniform(44), 24, 64), 0.5)
    assert np.allclose(residual_weight(uniform(-44), 24, 64), 0.5)
    assert np.allclose(residual_weight(uniform(10), 24, 64), 1.0)
    assert np.allclose(residual_weight(uniform(100), 24, 64), 0.0)
    lone = np.zeros((1, 9, 9, 3), np.int16)
    lone[0, 4, 4] = (250, 0, -250)  # one pixel: averaged to 10 at most, it does not switch
    assert np.allclose(residual_weight(lone, 24, 64), 1.0)
    block = np.zeros((1, 15, 15, 3), np.int16)
    block[0, 4:11, 4:11, 2] = 100  # 7 x 7 moved: its middle 3 x 3 average the full 100
    w = residual_weight(block, 24, 64)[0, ..., 0]
    assert w.shape == (15, 15) and np.allclose(w[6:9, 6:9], 0.0) and np.allclose(w[0, 0], 1.0)
    assert np.isclose(w[7, 4], 1 - (60 - 24) / 40)  # the block's edge: 3 of 5 columns, 60


def test_residual_gate_shows_the_decode_where_the_change_is_large():
    """A still camera, memory holding the start frame: a gate that opens at any change shows
    the model's own decode (as without the pixel residual); one over every change shows
    memory plus change (as without the gate)."""
    start = np.random.default_rng(0).integers(0, 256, (F, 128, 128, 3), dtype=np.uint8)

    def first_chunk(**cfg):
        gen = tiny_generator(**cfg)
        state = gen.new_state("a green meadow", seed=3, start_frames=start)
        (res,) = gen.generate([ChunkJob(state, [4] * F, steps=1, seed=0)])  # idle
        assert res.error is None
        return res.frames

    plain, decoded = first_chunk(), first_chunk(pixel_residual=False)
    opened = first_chunk(residual_gate=(0.0, 1e-3))
    assert np.abs(plain.astype(int) - decoded).mean() > 2  # the two ways differ here
    assert (opened == decoded).mean() > 0.99
    np.testing.assert_array_equal(first_chunk(residual_gate=(254.0, 255.0)), plain)
    for bad in ((10.0, 5.0), (-1.0, 5.0), (3.0, 3.0)):
        with pytest.raises(ValueError, match="residual_gate"):
            BuiltinConfig(residual_gate=bad)


def test_window_pose_tolerance_leaves_out_frames_posed_elsewhere(monkeypatch):
    """A rig-posed model: while the head rests every window frame is attended; the chunk after
    a turn key attends none of the frames before it (their head a quarter of a turn away and
    more); once the head has settled, all again. Before the key the frames equal a run
    without the tolerance; at the key they differ."""
    right = 5  # the direction id of the right arrow (dx = 1): yaw eases 0 -> 1
    assert action_to_direction(right) == (1, 0)
    actions = [[4] * F] * 3 + [[right] * F] * 12
    frames, seen = {}, []
    for tol in (None, 0.1):
        gen = tiny_generator(pose_path="head_rig_fit", window_chunks=3, memory_chunks=4,
                             window_pose_tolerance=tol)
        def spy(backend, state, record, tol=tol):
            pages = attended(backend, state, record)
            if tol is not None:
                seen.append((len(pages), len(state.table.attended_pages())))
            return pages

        monkeypatch.setattr(pages_stage, "attended", spy)
        state = gen.new_state("a green meadow", seed=3)
        frames[tol] = [gen.generate([ChunkJob(state, act, steps=1, seed=n)])[0].frames
                       for n, act in enumerate(actions)]
    # chunks 1-2 rest (chunk 0 is the stream's first: nothing to leave out), chunk 3 turns
    assert seen[1][0] == seen[1][1] > 0 and seen[2][0] == seen[2][1] > 0
    assert seen[3] == (0, seen[3][1]) and seen[3][1] > 0
    assert seen[-1][0] == seen[-1][1] > 0  # yaw 1 - 0.75^22 from 1 - 0.75^24: settled
    for n in range(3):
        np.testing.assert_array_equal(frames[0.1][n], frames[None][n])
    assert not np.array_equal(frames[0.1][3], frames[None][3])
    with pytest.raises(ValueError, match="window_pose_tolerance"):
        BuiltinConfig(window_pose_tolerance=-0.1)


def test_residual_deadzone_keeps_remembered_pixels_under_it():
    """A still camera: memory holds the start frame (but the centre box). Under a dead zone
    larger than any change, every remembered pixel is shown as remembered; without it the
    random model's changes show."""
    start = np.random.default_rng(0).integers(0, 256, (F, 128, 128, 3), dtype=np.uint8)
    keep = ~centre_box(128, 13)
    frames = {}
    for tau in (0.0, 254.0):
        gen = tiny_generator(residual_deadzone=tau)
        state = gen.new_state("a green meadow", seed=3, start_frames=start)
        (res,) = gen.generate([ChunkJob(state, [4] * F, steps=1, seed=0)])  # idle
        assert res.error is None
        frames[tau] = res.frames
    for frame in frames[254.0]:
        # real frames: the newest of the start chunk is what memory holds
        np.testing.assert_array_equal(frame[keep], start[-1][keep])
    assert np.abs(frames[0.0][:, keep].astype(int) - start[-1][keep]).mean() > 2
    with pytest.raises(ValueError, match="residual_deadzone"):
        BuiltinConfig(residual_deadzone=255)


def test_memory_settle_px_is_how_far_inside_new_ground_is_rewritten():
    """Moving right from the start frames: the pixels a frame rewrites (``refining``) are
    recomputed here from the camera windows alone — a real frame final where it covers, a
    generated pixel keeping the largest distance from a frame border (plus one, capped at the
    setting) it was seen at, the sprite never written — and at 32 px they reach past where
    16 px stops."""
    start = np.random.default_rng(0).integers(0, 256, (F, 128, 128, 3), dtype=np.uint8)
    reached = {}
    for settle in (16, 32):
        gen = tiny_generator(memory_settle_px=settle, memory_chunks=16)  # every chunk kept
        exact_camera(gen.model.camera)
        state = gen.new_state("a green meadow", seed=3, start_frames=start)
        assert state.memory.settle_px == settle
        assert gen.fork(state).memory.settle_px == settle
        for chunk in range(10):  # right: new ground; the last chunk reads memory's windows
            before = state.memory.fork()
            (res,) = gen.generate([ChunkJob(state, [5] * F, steps=1, seed=chunk)])
            gen.finish()
            assert res.error is None
        history = list(state.history)
        assert len(history) == 11  # the start frames and every chunk
        windows = [(rec.origins, rec is history[0]) for rec in history[:-1]]
        # the expected view map on a canvas around every window
        lo = min(o.min(axis=0).min() for o, _ in windows) - 256
        canvas = np.zeros((1024, 1024), np.int32)  # 0: never written
        d = np.minimum(np.arange(128), np.arange(128)[::-1])
        view = np.minimum(np.minimum(d[:, None], d[None, :]) + 1, settle)
        for origins, real in windows:
            for x0, y0 in origins:
                ys, xs = slice(y0 - lo, y0 - lo + 128), slice(x0 - lo, x0 - lo + 128)
                seen = np.full((128, 128), settle) if real else view
                new = np.where(gen._exclude, canvas[ys, xs], np.maximum(canvas[ys, xs], seen))
                canvas[ys, xs] = seen if real else new
        x0, y0 = state.history[-1].origins[0]
        old = canvas[y0 - lo : y0 - lo + 128, x0 - lo : x0 - lo + 128]
        expected = (old > 0) & (old < view)
        refining = before.read(x0, y0, 128).refining
        np.testing.assert_array_equal(refining, expected)
        assert expected.sum() > 100
        reached[settle] = 128 - np.nonzero(refining.any(axis=0))[0].min()  # px in from the right
    assert reached[16] <= 16 + 8 < reached[32]
    with pytest.raises(ValueError, match="memory_settle_px"):
        BuiltinConfig(memory_settle_px=0)


def _onto_new_ground(**cfg):
    """A tiny generator with ``cfg`` started from random frames, moved right for two chunks
    (the second rewriting new ground the first generated beyond the start frames, which are
    final: real frames): ``(frames of the second chunk, generator, state, memory as the
    second chunk read it)``."""
    start = np.random.default_rng(0).integers(0, 256, (F, 128, 128, 3), dtype=np.uint8)
    gen = tiny_generator(**cfg)
    exact_camera(gen.model.camera)
    state = gen.new_state("a green meadow", seed=3, start_frames=start)
    gen.generate([ChunkJob(state, [5] * F, steps=1, seed=0)])  # right: new ground
    gen.finish()
    before = state.memory.fork()
    (res,) = gen.generate([ChunkJob(state, [5] * F, steps=1, seed=1)])  # right
    gen.finish()
    assert res.error is None
    return res.frames, gen, state, before


def _carried_detail(gen, memory, x0: int, y0: int):
    """Recomputed from ``memory`` and the autoencoder, for the view at ``(x0, y0)``: its
    ``MemoryRead``, and on its refining pixels the decode of its base and the detail memory
    carries over it (picture less that decode), ``(P, 3)`` int16 each."""
    read = memory.read(x0, y0, 128)
    picture, _ = model_inputs(read, gen.downsample)
    base = gen.decode_latents(gen.encode_frames(picture[None]))[0].astype(np.int16)
    under = base[read.refining]
    return read, under, picture.astype(np.int16)[read.refining] - under


def test_detail_gain_hand_worked():
    detail = np.array([[3, 0, -4], [0, 0, 0]])  # RMS sqrt(25 / 6)
    assert detail_gain(detail, reference=1.5, cap=2.0) == 1.0  # RMS 2.04 <= 3: no limit
    assert detail_gain(detail, reference=0.5, cap=2.0) == pytest.approx(1 / np.sqrt(25 / 6))
    assert detail_gain(np.zeros((0, 3)), reference=0.1, cap=1.0) == 1.0
    assert detail_gain(np.zeros((4, 3)), reference=0.1, cap=1.0) == 1.0


def test_refining_detail_cap_limits_the_detail_carried_onto_new_ground():
    """Moving right on from generated ground with the cap: each frame shows, where it rewrites
    memory's not yet settled pixels, its decode plus the remembered detail (picture less
    the decode of its base) scaled to at most ``cap`` times the RMS the autoencoder loses on
    the start frames — each recomputed here from the memory and the autoencoder — and
    elsewhere what it shows without the cap; after a prompt switch nothing is limited."""
    # _onto_new_ground's start frames
    start = np.random.default_rng(0).integers(0, 256, (F, 128, 128, 3), dtype=np.uint8)
    cap = 0.005  # a cap that binds (the tiny random autoencoder loses more than it carries)
    runs = {limit: _onto_new_ground(refining_detail_cap=limit, refining_detail_shading=False)
            for limit in (None, cap)}
    (plain, _, _, _), (shown, gen, state, before) = runs[None], runs[cap]
    lost = start.astype(np.float32) - gen.decode_latents(gen.encode_frames(start))
    reference = float(np.sqrt(np.mean(np.square(lost))))
    assert state.detail_reference == pytest.approx(reference, rel=1e-5)
    rec = state.history[-1]
    model = gen.decode_latents(rec.latents).astype(np.int16)
    for i, (x0, y0) in enumerate(rec.origins):
        read, _, detail = _carried_detail(gen, before, x0, y0)
        rms = np.sqrt(np.mean(np.square(detail.astype(np.float64))))
        gain = cap * reference / rms
        assert read.refining.sum() > 100 and gain < 0.5
        expect = np.clip(model[i][read.refining] + np.rint(gain * detail), 0, 255)
        assert np.abs(shown[i][read.refining].astype(int) - expect).max() <= 1
        rest = read.current & ~read.refining
        np.testing.assert_allclose(shown[i][rest], plain[i][rest], atol=1)
    # a prompt switch: the reference becomes that of the frames a stream of the new prompt
    # (of a blend, its heavier part) would start from at the same world seed
    for blend, weight, scene in ((None, 0.0, "snow"), ("a desert", 0.3, "snow"),
                                 ("a desert", 0.7, "desert")):
        sim = WorldSimulator(3, scene)
        frames = np.stack([sim.step(IDLE) for _ in range(F)])
        lost = frames.astype(np.float32) - gen.decode_latents(gen.encode_frames(frames))
        gen.set_prompt(state, "a snowy forest", blend_text=blend, blend_weight=weight)
        assert state.detail_reference == pytest.approx(np.sqrt(np.mean(np.square(lost))),
                                                       rel=1e-5)


def test_shading_detail_hand_worked():
    colour = np.array([[99, 99, 99], [199, 99, 49], [0, 0, 0]])  # +1: (100,100,100), ...
    detail = np.array([[5.0, 5.0, 5.0], [10.0, -10.0, 0.0], [3.0, 0.0, 0.0]])
    out = shading_detail(detail, colour)
    np.testing.assert_allclose(out[0], [5, 5, 5])  # along the grey: all of it is shading
    # (200,100,50)·(10,-10,0) = 1000 over |c|² = 52,500: 0.019 of the colour
    np.testing.assert_allclose(out[1], np.array([200, 100, 50]) * 1000 / 52_500)
    np.testing.assert_allclose(out[2], [1, 1, 1])  # black shades along (1, 1, 1)
    # what is dropped is orthogonal to the colour: a hue of its own
    np.testing.assert_allclose(np.sum((detail - out)[:2] * (colour[:2] + 1), axis=-1), 0,
                               atol=1e-9)


def test_refining_detail_shading_keeps_only_the_carried_detail_along_the_decoded_colour():
    """Moving right on from generated ground: each frame shows, where it rewrites memory's
    not yet settled pixels, its decode plus the remembered detail (picture less the decode of
    its base) projected onto that decoded base colour — recomputed here from the memory and
    the autoencoder — and elsewhere what it shows without the setting."""
    runs = {on: _onto_new_ground(refining_detail_shading=on, refining_detail_cap=None)
            for on in (False, True)}
    (plain, _, _, _), (shown, gen, state, before) = runs[False], runs[True]
    rec = state.history[-1]
    model = gen.decode_latents(rec.latents).astype(np.int16)
    for i, (x0, y0) in enumerate(rec.origins):
        read, under, detail = _carried_detail(gen, before, x0, y0)
        assert read.refining.sum() > 100
        shade = shading_detail(detail.astype(np.float64), under)
        expect = np.clip(model[i][read.refining] + np.rint(shade), 0, 255)
        assert np.abs(shown[i][read.refining].astype(int) - expect).max() <= 1
        # and it changed something: the random start frames' detail has colours of its own
        # (the tiny model's decodes are dark, so it is small: 1.9 levels when written)
        full = np.clip(model[i][read.refining] + detail, 0, 255)
        assert np.abs(expect - full).mean() > 1
        rest = read.current & ~read.refining
        np.testing.assert_allclose(shown[i][rest], plain[i][rest], atol=1)


def test_anchor_colour_hand_worked():
    pixels = np.array([[100.0, 10.0, 50.0], [60.0, 30.0, 70.0]])
    mean = np.array([80.0, 20.0, 60.0])
    reference = np.array([50.0, 40.0, 58.0])
    out = anchor_colour(pixels, mean, reference, tolerance=10.0)
    # red above the band (60): scaled by 60 / 80; green below it (30): lifted by 10; blue
    # within it: unchanged
    np.testing.assert_allclose(out, [[75.0, 20.0, 50.0], [45.0, 40.0, 70.0]])
    np.testing.assert_allclose(anchor_colour(pixels, mean, mean, 0.0), pixels)


@pytest.mark.parametrize("level", [0, 255])
def test_colour_anchor_corrects_generated_ground_by_the_running_mean_beyond_the_tolerance(
        monkeypatch, level):
    """Moving right from black (white) start frames: with the anchor each frame of the chunk
    shows, on the ground the model generates (not current in memory, or being refined; the
    sprite excluded), the frame without the anchor brought into the tolerance band around the
    start frames' colour by its running mean — scaled down from above black, lifted below
    white — the running mean recomputed here from the frames without it; everything else
    alike."""
    import worldstream.engine.backends.builtin.colour as colour

    monkeypatch.setattr(colour, "ANCHOR_DECAY", 0.5)  # a correction large enough to see
    start = np.full((F, 128, 128, 3), level, np.uint8)
    tolerance = 3.0
    runs = {}
    for anchor in (None, tolerance):
        gen = tiny_generator(colour_anchor=anchor)
        exact_camera(gen.model.camera)
        state = gen.new_state("a green meadow", seed=3, start_frames=start)
        gen._prefill(state)  # the start frames into context and memory now
        before = state.memory.fork()
        (res,) = gen.generate([ChunkJob(state, [5] * F, steps=1, seed=0)])  # right
        gen.finish()
        assert res.error is None
        runs[anchor] = (res.frames, state, before, gen)
    (plain, _, _, _), (shown, state, before, gen) = runs[None], runs[tolerance]
    np.testing.assert_array_equal(state.colour_reference, [level] * 3)
    mean = np.full(3, float(level))
    sprite = centre_box(128, gen.model.config.view_box)
    for i, (x0, y0) in enumerate(state.history[-1].origins):
        read = before.read(x0, y0, 128)
        ground = (~read.current | read.refining) & ~sprite
        assert ground.sum() > 100
        pixels = plain[i][ground].astype(np.float64)
        mean = 0.5 * mean + 0.5 * pixels.mean(axis=0)
        expect = pixels.copy()
        for c in range(3):  # above the band: a gain to its top; below it: a shift to its foot
            if mean[c] > level + tolerance:
                expect[:, c] *= (level + tolerance) / mean[c]
            elif mean[c] < level - tolerance:
                expect[:, c] += level - tolerance - mean[c]
        expect = np.clip(np.rint(expect), 0, 255)
        assert np.abs(expect - pixels).max() > 2
        assert np.abs(shown[i][ground].astype(int) - expect).max() <= 1
        np.testing.assert_allclose(shown[i][~ground], plain[i][~ground], atol=1)
    np.testing.assert_allclose(state.history[-1].colour_mean, mean, atol=0.05)


def test_a_prompt_switch_restarts_the_colour_anchor_at_its_first_generated_frame(monkeypatch):
    """A running mean that never moves (decay 1) and a tolerance that never corrects: the
    mean after the start frames is their colour; after a prompt switch the reference is the
    snow scene's start frames' mean colour at the same world seed (computed here from the
    simulator) and the running mean that of the first frame's generated ground after the
    switch; after a rewind past the switch, that of the first frame generated after the
    rewind (the chunks kept were kept against the old reference). The generated ground of
    each frame is read from what the anchor was given."""
    import worldstream.engine.backends.builtin.colour as colour

    monkeypatch.setattr(colour, "ANCHOR_DECAY", 1.0)
    start = np.zeros((F, 128, 128, 3), np.uint8)
    sim = WorldSimulator(3, "snow")
    snow = np.stack([sim.step(IDLE) for _ in range(F)]).reshape(-1, 3).mean(axis=0)
    gen = tiny_generator(colour_anchor=1000.0)
    exact_camera(gen.model.camera)
    seen = []
    spy = compositing.anchor_colours

    def anchor_colours(backend, states, records, rgb, views):
        generated = (~views.current | views.refining) & ~gen._exclude
        seen.append(rgb[0][generated[0]].astype(np.float64).mean(axis=0))  # first frame
        spy(backend, states, records, rgb, views)

    monkeypatch.setattr(compositing, "anchor_colours", anchor_colours)
    state = gen.new_state("a green meadow", seed=3, start_frames=start)

    def chunk(seed):
        (res,) = gen.generate([ChunkJob(state, [5] * F, steps=1, seed=seed)])  # right
        assert res.error is None
        return seen[-1]

    chunk(0)
    chunk(1)
    np.testing.assert_array_equal(state.history[-1].colour_mean, [0.0, 0.0, 0.0])
    gen.set_prompt(state, "a snowy forest")
    np.testing.assert_allclose(state.colour_reference, snow)
    first = chunk(2)
    chunk(3)
    np.testing.assert_allclose(state.history[-1].colour_mean, first)
    np.testing.assert_array_equal(state.history[-1].colour_reference, state.colour_reference)
    gen.rewind(state, 3)  # back to the first chunk after the start, kept against black
    first = chunk(4)
    gen.finish()
    np.testing.assert_allclose(state.history[-1].colour_mean, first)
    assert np.abs(first - snow).max() > 1 and np.abs(first).max() > 1


def test_a_colour_prior_shrinks_the_reference_toward_the_scene_colour():
    """With a colour prior the reference is the real frames' mean colour shrunk toward the
    prompt's scene's colour by the prior's view weight (and the running mean starts there);
    after a prompt switch the same of the new scene's start view at the world seed (computed
    here from the simulator); of a blend, its heavier part's, also for real frames observed
    under the blend; a scene the prior does not know keeps its view's colour."""
    prior = ColourPrior({"meadow": (80.0, 140.0, 90.0), "snow": (170.0, 180.0, 190.0)}, 0.25)
    gen = tiny_generator(colour_anchor=8.0, colour_prior=prior)
    state = gen.new_state("a green meadow", seed=3,
                          start_frames=np.full((F, 128, 128, 3), 100, np.uint8))
    gen._prefill(state)
    np.testing.assert_allclose(state.colour_reference, [85.0, 130.0, 92.5])
    np.testing.assert_allclose(state.history[-1].colour_mean, [85.0, 130.0, 92.5])

    def start_view(scene):
        sim = WorldSimulator(3, scene)
        return np.stack([sim.step(IDLE) for _ in range(F)]).reshape(-1, 3).mean(axis=0)

    snow = np.array([170.0, 180.0, 190.0])
    for blend, weight, expect in (
            (None, 0.0, snow + 0.25 * (start_view("snow") - snow)),
            ("a sandy desert", 0.3, snow + 0.25 * (start_view("snow") - snow)),
            ("a sandy desert", 0.7, start_view("desert"))):
        gen.set_prompt(state, "a snowy forest", blend_text=blend, blend_weight=weight)
        np.testing.assert_allclose(state.colour_reference, expect)
    # real frames observed after a blend whose heavier part is the snow: the snow's colour
    gen.set_prompt(state, "a sandy desert", blend_text="a snowy forest", blend_weight=0.7)
    gen.observe(state, np.full((F, 128, 128, 3), 100, np.uint8), [IDLE] * F)
    np.testing.assert_allclose(state.colour_reference, snow + 0.25 * (100.0 - snow))


def test_spatial_pages_bring_back_the_overlapping_past():
    """With ``spatial_pages`` a chunk attends, beyond its window, the older pages whose camera
    window overlaps its view most: after a loop out and back those are the first frames."""
    gen = tiny_generator(window_chunks=2, memory_chunks=40, spatial_pages=2)
    exact_camera(gen.model.camera)
    state = gen.new_state("a green meadow", seed=3)
    script = [5] * 8 + [4] * 14 + [3] * 8 + [4] * 14  # right, coast, left, coast
    for n in range(0, len(script), F):
        (res,) = gen.generate([ChunkJob(state, script[n : n + F], steps=1, seed=n)])
        assert res.error is None
    view = state.history[-1].origins[-1]
    older = state.table.older_pages()
    recs = list(state.history)[: len(older) // F]
    origins = [o for r in recs for o in r.origins]
    chosen = pages_stage.spatial_pages(gen, state, state.history[-1].origins)
    assert len(chosen) == 2
    # independent check: the two pages with the largest overlap area with the current view
    area = [max(0, 128 - abs(int(o[0] - view[0]))) * max(0, 128 - abs(int(o[1] - view[1])))
            for o in origins]
    best = sorted(range(len(older)), key=lambda i: -area[i])[:2]
    assert sorted(chosen) == sorted(older[i] for i in best)
    assert min(area[i] for i in best) > 0.8 * 128 * 128


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


def test_fork_rewind_free_return_every_page():
    gen = tiny_generator(memory_chunks=6)
    total = gen.allocator.num_free()
    s = gen.new_state("a green meadow", seed=1)
    for n in range(4):
        gen.generate([ChunkJob(s, [4, 4], steps=1, seed=n)])
    branches = [gen.fork(s) for _ in range(3)]
    res = gen.generate([ChunkJob(b, [5, 5], steps=1, seed=i) for i, b in enumerate(branches)])
    assert all(r.error is None for r in res)
    # different seeds give different futures from the same past
    assert not np.array_equal(res[0].frames, res[1].frames)
    before = s.history[-1].latents.clone()
    camera = s.camera
    remembered = s.memory.read(-200, -200, 400).rgb.copy()
    gen.generate([ChunkJob(s, [5, 5], steps=1, seed=9)])
    gen.rewind(s, 1)
    assert torch.equal(s.history[-1].latents, before)
    # the rewind also took back the camera motion and what the chunk wrote to memory
    assert np.array_equal(s.camera[0], camera[0])
    assert np.array_equal(s.memory.read(-200, -200, 400).rgb, remembered)
    with pytest.raises(ValueError):
        gen.rewind(s, 100)
    for b in branches:
        gen.free(b)
    gen.free(s)
    gen.free(s)  # idempotent
    assert gen.allocator.num_free() == total


def test_deferred_cache_fill_builds_no_autograd_graph():
    """Issue 12: the cache fill left for finish() (or for the next call, e.g. a fork) ran with
    autograd on, chaining every fill onto the page pool: 110 MB/s under a fork flood."""
    gen = tiny_generator()
    s = gen.new_state("a green meadow", seed=1)
    for n in range(3):
        gen.generate([ChunkJob(s, [4, 4], steps=1, seed=n)])
        if n == 0:
            gen.finish()  # the engine's path
        else:
            gen.free(gen.fork(s))  # another call settles the deferred fill first
    gen.finish()
    for pool in (gen.k_pool, gen.v_pool):
        assert not pool.requires_grad and pool.grad_fn is None
    assert all(r.latents is None or not r.latents.requires_grad for r in s.history)


def test_prompt_switch_recaches_window_without_touching_shared_pages():
    gen = tiny_generator()
    s = gen.new_state("a green meadow", seed=1)
    for n in range(3):
        gen.generate([ChunkJob(s, [4, 4], steps=1, seed=n)])
    twin = gen.fork(s)
    shared = s.table.window_pages()
    k_before = gen.k_pool[:, shared].clone()
    gen.set_prompt(s, "a snowy forest")
    (r,) = gen.generate([ChunkJob(s, [4, 4], steps=1, seed=5)])
    assert r.error is None
    # the twin's pages still hold the old keys (copy-on-write), the session moved to new pages
    assert torch.equal(gen.k_pool[:, twin.table.window_pages()], k_before)
    assert set(s.table.window_pages()).isdisjoint(shared[2:])


def test_bad_jobs_fail_alone():
    gen = tiny_generator()
    a, b = gen.new_state("a green meadow", seed=1), gen.new_state("a snowy forest", seed=2)
    res = gen.generate([ChunkJob(a, [4, 99], steps=1), ChunkJob(b, [4, 4], steps=1)])
    assert isinstance(res[0].error, ValueError) and res[1].error is None
    with pytest.raises(ValueError):
        gen.new_state("", seed=0)


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


def test_memory_frames_and_attention_settings_reach_the_attention_context():
    """The protocol's ``memory_frames`` narrows the pages a session's chunks attend (whole
    chunks, one chunk up to the model's window); ``attention`` picks its kernel; values outside
    those are refused with nothing changed (issue 13: they always answered "unsupported")."""
    gen = tiny_generator(window_chunks=3, memory_chunks=4)
    state = gen.new_state("a meadow", 0)
    for c in range(4):
        gen.generate([ChunkJob(state, [4] * F, 1, seed=c)])
    gen.finish()
    assert len(state.table.window_pages()) == 3 * F
    with pytest.raises(ValueError, match="memory_frames"):
        gen.configure(state, memory_frames=3 * F + 1)
    with pytest.raises(ValueError, match="attention backend"):
        gen.configure(state, memory_frames=1, attention="no-such-kernel")
    assert len(state.table.window_pages()) == 3 * F and state.attention is None
    gen.configure(state, memory_frames=F + 1, attention="reference")  # rounds up to 2 chunks
    assert len(state.table.window_pages()) == 2 * F and state.attention == "reference"
    seen = []
    context = gen._context
    gen._context = lambda pages, contexts, *a, **k: seen.append(contexts) or context(
        pages, contexts, *a, **k)
    gen.generate([ChunkJob(state, [4] * F, 1, seed=9)])
    assert len(seen[0][0]) == 2 * F  # the denoise attends the narrowed window only


def _dense_last_chunk(gen, recs, last, text, actions=None, window=8):
    """The dense block-causal forward's prediction for chunk ``last`` of ``recs`` (one
    denoising step from its seeded noise, no sink, ``text (1, frames, 384)`` per frame,
    ``actions`` per frame or the records')."""
    m = gen.model
    k = (last + 1) * F
    noise = seeded_noise(gen, 100 + last - 1, recs[last])
    seq = torch.cat([r.context for r in recs[:last]] + [noise])[None]
    sigma = torch.full((1, k), gen.config.ctx_sigma)
    sigma[:, -F:] = 1.0
    mask = expand_frame_mask(window_mask(last + 1, window, False), m.tokens_per_frame)
    if actions is None:
        actions = [a for r in recs[: last + 1] for a in r.actions]
    with torch.no_grad():
        return m(seq, torch.cat([r.base for r in recs[: last + 1]])[None],
                 torch.full((1, k), gen.config.ctx_sigma),
                 torch.cat([r.known for r in recs[: last + 1]])[None], sigma,
                 torch.tensor(actions)[None], text, torch.arange(k)[None],
                 DenseContext(mask))[0, -F:]


def _prompt_guided_reference(gen, recs, last: int, text: torch.Tensor, g_scale: float):
    """Chunk ``last``'s dense reference plain and prompt-guided: ``(c, c + (g - 1)(c - u))``,
    u with the chunk's own text dropped (``text (1, 1, 384)``, every frame's)."""
    cond_text = text.expand(1, (last + 1) * F, -1).clone()
    free_text = cond_text.clone()
    free_text[:, -F:] = 0
    c = _dense_last_chunk(gen, recs, last, cond_text)
    u = _dense_last_chunk(gen, recs, last, free_text)
    return c, c + (g_scale - 1) * (c - u)


@pytest.mark.parametrize("batched", [True, False])
def test_prompt_guidance_after_a_switch_equals_the_dense_reference(batched):
    """The ``guidance_chunks`` chunks after a prompt switch are denoised with classifier-free
    guidance (``c + (g - 1) (c - u)``, u: the query chunk's own text dropped, its context as
    cached); the chunks before the switch and after the guided ones are plain. Both ways of
    running the negative forward (``batched_guidance``): the chunks after a guided one
    attend its keys/values, so a negative row's left in the cache would show."""
    g_scale = 2.5
    gen = tiny_generator(window_chunks=8, sink=False, memory_chunks=8, ctx_noise=False,
                         guidance=g_scale, guidance_chunks=2, restyle_chunks=1,
                         batched_guidance=batched)
    state = gen.new_state("a green meadow", seed=3)
    for n in range(5):
        if n == 2:
            gen.set_prompt(state, "a snowy forest")
        (res,) = gen.generate([ChunkJob(state, [2, 2], steps=1, seed=100 + n)])
        assert res.error is None
    gen.finish()
    recs = list(state.history)  # the start chunk + 5 generated
    assert [r.guided for r in recs] == [False, False, False, True, True, False]
    text = torch.as_tensor(state.text)[None, None]  # the window was recached under it
    for last in range(3, 6):
        c, guided = _prompt_guided_reference(gen, recs, last, text, g_scale)
        want = guided if recs[last].guided else c
        got = recs[last].latents
        assert torch.allclose(want, got, atol=1e-4), (last, (want - got).abs().max())
        if recs[last].guided:  # and guidance changed the chunk
            assert (c - got).abs().max() > 1e-2


@pytest.mark.parametrize("batched", [True, False])
def test_action_guidance_equals_the_dense_reference(batched):
    """With ``action_guidance`` a chunk asking any non-neutral action is denoised with
    ``c + (g - 1) (c - u)``, u: its own actions replaced by the neutral one; a chunk of
    neutral actions only is plain; both guidances together add their terms (two negative
    rows beside the conditional one when ``batched_guidance``)."""
    g_act, g_txt, idle = 1.8, 2.5, 4
    gen = tiny_generator(window_chunks=8, sink=False, memory_chunks=8, ctx_noise=False,
                         action_guidance=g_act, neutral_action=idle, guidance=g_txt,
                         guidance_chunks=1, restyle_chunks=1, batched_guidance=batched)
    state = gen.new_state("a green meadow", seed=3)
    plan = [[idle, idle], [2, idle], [idle, idle], [6, 6]]
    for n, acts in enumerate(plan):
        if n == 3:
            gen.set_prompt(state, "a snowy forest")
        (res,) = gen.generate([ChunkJob(state, acts, steps=1, seed=100 + n)])
        assert res.error is None
    gen.finish()
    recs = list(state.history)
    old_text, new_text = gen._embed("a green meadow", None, 0.0), state.text
    for last in range(1, 5):  # chunk 4 came after the switch (the window recached under it)
        emb = torch.as_tensor(new_text if last == 4 else old_text)
        text = emb[None, None].expand(1, (last + 1) * F, -1).clone()
        acts = [a for r in recs[: last + 1] for a in r.actions]
        c = _dense_last_chunk(gen, recs, last, text)
        want = c
        if any(a != idle for a in recs[last].actions):
            neutral = acts[:-F] + [idle] * F
            want = want + (g_act - 1) * (c - _dense_last_chunk(gen, recs, last, text, neutral))
        if recs[last].guided:
            free = text.clone()
            free[:, -F:] = 0
            want = want + (g_txt - 1) * (c - _dense_last_chunk(gen, recs, last, free))
        got = recs[last].latents
        assert torch.allclose(want, got, atol=1e-4), (last, (want - got).abs().max())
    assert [r.guided for r in recs] == [False, False, False, False, True]
    with pytest.raises(ValueError, match="neutral_action"):
        BuiltinConfig(action_guidance=2.0)


def test_action_guidance_keeps_the_kept_factors_as_asked():
    """The negative condition of factored actions: the neutral action except in the kept
    factors (the avatar keeps its head direction, so turns are not guided); a chunk whose
    only non-neutral factor is kept gets no action guidance."""
    from worldstream.engine.worlds.avatar.actions import (
        ACTION_FACTORS,
        NUM_ACTIONS,
        decode_action,
        encode_action,
    )

    torch.manual_seed(0)
    model = WorldDiT(dim=64, depth=2, num_heads=2, chunk_frames=F, num_actions=NUM_ACTIONS,
                     action_factors=ACTION_FACTORS)
    gen = BuiltinBackend(model, build_autoencoder(width=8), BuiltinConfig(
        attention_backend="reference", action_guidance=2.0, neutral_action=encode_action(),
        kept_factors=(0,)))
    asked = [encode_action(2, 3, 5), encode_action(7, 0, 0), encode_action(4, 1, 0)]
    got = guidance.neutral_actions(gen, torch.tensor(asked)[:, None])[:, 0].tolist()
    assert [decode_action(a) for a in got] == [(2, 0, 0), (7, 0, 0), (4, 0, 0)]
    with pytest.raises(ValueError, match="kept_factors"):
        tiny_generator(action_guidance=2.0, neutral_action=4, kept_factors=(0,))


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


@pytest.mark.skipif(not (shutil.which("c++") or shutil.which("g++")),
                    reason="torch.compile (inductor) needs a C++ compiler")
def test_compiled_model_streams_what_the_eager_model_streams():
    """``compile=True`` swaps the model for its torch.compile form (after warm-up chunks of one
    and of two streams): streams of one and of three sessions, prompt guidance on after a
    switch (the negative rows stacked with the conditional ones), must carry the eager
    model's latents and frames; the forward must be one graph (the paged attention an opaque
    op in it, no graph break), not recompiled per chunk (the context grows every chunk) nor
    for a guided chunk's stacked rows."""
    import torch._dynamo

    eager = tiny_generator(max_states=4)
    torch._dynamo.utils.counters.clear()
    compiled = tiny_generator(max_states=4, compile=True)
    assert compiled._net is not compiled.model  # compiled, not fallen back to eager
    assert not torch._dynamo.utils.counters["graph_break"]
    torch._dynamo.utils.counters.clear()
    prompts = ["a snowy forest", "hot desert dunes seen from above", "a dark landscape at night"]
    for sessions in (1, 3):
        pairs = [(eager.new_state(p, seed=i), compiled.new_state(p, seed=i))
                 for i, p in enumerate(prompts[:sessions])]
        for n in range(4):
            if n == 2:  # the next chunks are guided on the new prompt
                for a, b in pairs:
                    eager.set_prompt(a, "a green meadow")
                    compiled.set_prompt(b, "a green meadow")
            jobs = [[ChunkJob(s, [i, 8 - i], steps=2, seed=10 * i + n)
                     for i, s in enumerate(states)] for states in zip(*pairs)]
            want, got = eager.generate(jobs[0]), compiled.generate(jobs[1])
            for a, b in zip(want, got):
                # uint8 frames: the pixel residual rounds the decoded frame and the decoded
                # base, so a last-bit difference in the latents can move a pixel by 2
                diff = int(np.abs(a.frames.astype(int) - b.frames.astype(int)).max())
                assert diff <= 2, f"chunk {n}: frames differ by {diff} levels"
            eager.finish()
            compiled.finish()
        for a, b in pairs:
            torch.testing.assert_close(b.history[-1].latents, a.history[-1].latents,
                                       atol=3e-3, rtol=1e-2)
            eager.free(a)
            compiled.free(b)
    # the warm-up compiled the graphs for 1 and 2+ streams: nothing compiles afterwards
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 0


@pytest.mark.skipif(not (shutil.which("c++") or shutil.which("g++")),
                    reason="torch.compile (inductor) needs a C++ compiler")
def test_a_compiled_stream_does_not_compile_at_its_first_guided_action():
    """A stream of one-frame chunks (the shipped models') whose first action asks for action
    guidance (the avatar's first expression key) and whose prompt then switches must find
    every graph compiled by the warm-up: the guided step's stacked rows once took a graph of
    their own (the one-frame chunk's text entered the graph as a view, the stacked rows not)
    and the avatar's stream stalled 8 s at its first smile."""
    import torch._dynamo

    idle = 4
    torch.manual_seed(0)
    model = WorldDiT(dim=64, depth=2, num_heads=2, chunk_frames=1)
    gen = BuiltinBackend(model, build_autoencoder(width=8), BuiltinConfig(
        max_states=2, compile=True, action_guidance=2.0, neutral_action=idle, guidance=2.0,
        steady_guidance_sigma=None, first_step_from_memory=None, colour_anchor=None))
    assert gen._net is not gen.model
    torch._dynamo.utils.counters.clear()
    state = gen.new_state("a green meadow", seed=1)
    for n, acts in enumerate([[idle], [2], [idle], [6]]):
        if n == 3:
            gen.set_prompt(state, "a snowy forest")
        (res,) = gen.generate([ChunkJob(state, acts, steps=2, seed=n)])
        assert res.error is None and res.frames.shape == (1, 128, 128, 3)
    gen.finish()
    gen.free(state)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 0


def test_a_compiled_attention_without_a_bound_context_says_so():
    """Inside a compiled graph the model attends through the context bound by
    ``attention.bound``; called with none bound the op raises a clear error instead of
    attending to nothing, and a binding ends with its block (nested ones restore the outer)."""
    q = torch.zeros(1, 2, 4, 8)
    with pytest.raises(RuntimeError, match="bound"):
        torch.ops.worldstream.attend(q, q, q, 0)

    class Echo:
        def __init__(self, scale):
            self.scale = scale

        def attend(self, q, k, v, layer):
            return q * self.scale + layer

    with attention.bound(Echo(2.0)):
        with attention.bound(Echo(3.0)):
            assert torch.equal(torch.ops.worldstream.attend(q + 1, q, q, 1), q + 4)
        assert torch.equal(torch.ops.worldstream.attend(q + 1, q, q, 0), q + 2)
    with pytest.raises(RuntimeError, match="bound"):
        torch.ops.worldstream.attend(q, q, q, 0)


def test_a_failed_compile_leaves_the_model_eager(monkeypatch, caplog):
    """Where torch.compile cannot build the model (e.g. no C++ compiler), the backend says so
    and streams with the eager model: same frames as a backend that never tried."""
    def broken(model, **kwargs):
        def fails(*args, **kw):
            raise RuntimeError("no working C++ compiler")
        return fails

    monkeypatch.setattr(torch, "compile", broken)
    with caplog.at_level("WARNING"):
        gen = tiny_generator(compile=True)
    assert gen._net is gen.model and "no working C++ compiler" in caplog.text
    want = tiny_generator()
    a, b = gen.new_state("a snowy forest", seed=0), want.new_state("a snowy forest", seed=0)
    (got,), (ref,) = (g.generate([ChunkJob(s, [1, 2], steps=2, seed=3)])
                      for g, s in ((gen, a), (want, b)))
    assert np.array_equal(got.frames, ref.frames)
    assert gen.allocator.num_free() == want.allocator.num_free()  # the warm-up freed its pages


def test_a_forward_that_raises_gives_its_pages_back():
    """A chunk whose forward fails (denoising, or the deferred cache fill) raises out of
    generate/finish with the pages it had taken returned to the shared pool."""
    gen = tiny_generator()
    state = gen.new_state("a snowy forest", seed=0)
    gen.generate([ChunkJob(state, [1, 2], steps=2, seed=0)])
    gen.finish()
    free = gen.allocator.num_free()
    model = gen._net

    def fails(*args, **kwargs):
        raise RuntimeError("forward failed")

    gen._net = fails
    with pytest.raises(RuntimeError, match="forward failed"):
        gen.generate([ChunkJob(state, [1, 2], steps=2, seed=1)])
    assert gen.allocator.num_free() == free
    gen._net = model
    gen.generate([ChunkJob(state, [1, 2], steps=2, seed=1)])  # denoised; the fill is deferred
    gen._net = fails
    with pytest.raises(RuntimeError, match="forward failed"):
        gen.finish()
    assert gen.allocator.num_free() == free


def test_world_noise_follows_the_ground_and_forks_read_the_same_world():
    """With ``world_noise`` each frame's initial noise is pinned to the world: unchanged while
    the camera rests (for less than the hold), shifted by whole latent pixels with it as it moves
    (the overlap of two frames' noise agrees), the same for a fork at the same place; without
    it every chunk draws afresh."""
    seen = {}
    for on in (True, False):
        gen = tiny_generator(world_noise=on)  # 14 frames: all within the default hold
        exact_camera(gen.model.camera)
        log = seen[on] = []

        def spy(backend, batch, log=log):
            noise_stage.noise(backend, batch)
            log.append((batch.records[0].origins.copy(), batch.noise[0]))

        gen.stages = replace_stage(gen.stages, "noise", spy)
        state = gen.new_state("a green meadow", seed=3)
        for acts in ([4] * F, [4] * F, [5] * F, [5] * F, [5] * F):
            (res,) = gen.generate([ChunkJob(state, acts, steps=1)])
            assert res.error is None
        branch = gen.fork(state)
        for st in (state, branch):  # the same chunk from the same place
            gen.generate([ChunkJob(st, [4] * F, steps=1)])
        gen.finish()
    (o_a, n_a), (o_b, n_b) = seen[True][0], seen[True][1]
    np.testing.assert_array_equal(o_a, o_b)
    torch.testing.assert_close(n_a, n_b, rtol=0, atol=0)  # at rest: the same noise
    (o_r, n_r) = seen[True][4]
    d = gen.downsample
    shift = o_r[-1] // d - o_a[0] // d  # whole latent pixels moved (x, y)
    assert shift[0] >= 1 and shift[1] == 0  # the camera went right
    k = int(shift[0])
    torch.testing.assert_close(n_r[-1][:, :, :-k], n_a[0][:, :, k:], rtol=0, atol=0)
    assert (n_r[-1] - n_a[0]).abs().mean() > 0.5  # and the noise did move with it
    torch.testing.assert_close(seen[True][5][1], seen[True][6][1], rtol=0, atol=0)  # fork
    assert (seen[False][0][1] - seen[False][1][1]).abs().mean() > 0.5  # fresh at rest too


@pytest.mark.parametrize("batched", [True, False])
def test_steady_guidance_guides_every_chunk_at_its_high_noise_steps_only(batched):
    """``steady_guidance_sigma``: outside the chunks after a switch, every chunk is guided on
    the prompt at the steps whose noise level reaches it. One step (σ = 1) and threshold 0.9:
    each chunk equals the dense reference ``c + (g - 1) (c - u)``; two steps (σ = 1, 0.5):
    the text-free negative forward runs at σ = 1 only, once a chunk — in the same forward as
    the conditional one with ``batched_guidance`` (its rows first), else before it."""
    g_scale = 2.5
    gen = tiny_generator(window_chunks=8, sink=False, memory_chunks=8, ctx_noise=False,
                         guidance=g_scale, guidance_chunks=0, restyle_chunks=1,
                         steady_guidance_sigma=0.9, batched_guidance=batched)
    state = gen.new_state("a green meadow", seed=3)
    for n in range(3):
        (res,) = gen.generate([ChunkJob(state, [2, 2], steps=1, seed=100 + n)])
        assert res.error is None
    gen.finish()
    recs = list(state.history)
    assert not any(r.guided for r in recs)  # no switch window: the steady rule alone
    text = torch.as_tensor(state.text)[None, None]
    for last in range(1, 4):
        c, want = _prompt_guided_reference(gen, recs, last, text, g_scale)
        assert torch.allclose(want, recs[last].latents, atol=1e-4)
        assert (c - recs[last].latents).abs().max() > 1e-2
    seen = []
    forward = gen._forward

    def spy(x, sigma, cond, ctx):  # each row: is its text dropped?
        seen.append((round(float(sigma), 3), tuple(bool((t == 0).all()) for t in cond[4])))
        return forward(x, sigma, cond, ctx)

    gen._forward = spy
    (res,) = gen.generate([ChunkJob(state, [2, 2], steps=2, seed=200)])
    assert res.error is None
    gen.finish()
    denoise = [s for s in seen if s[0] > gen.config.ctx_sigma]  # the cache fill runs at ctx σ
    assert denoise == ([(1.0, (True, False)), (0.5, (False,))] if batched else
                       [(1.0, (True,)), (1.0, (False,)), (0.5, (False,))])
    with pytest.raises(ValueError, match="steady_guidance_sigma"):
        BuiltinConfig(steady_guidance_sigma=0.0)


def test_negative_rows_write_to_scratch_pages_outside_the_allocator():
    """A batched guided forward's negative rows attend their conditional row's pages with the
    chunk's own pages swapped for scratch pages, which lie past the allocator's pages (never
    handed to a stream); too few scratch pages is an error."""
    gen = tiny_generator(guidance=2.0, max_states=2)
    scratch = gen._scratch_pages
    assert scratch == list(range(gen.allocator.num_pages, gen.k_pool.shape[1]))
    assert len(scratch) == gen.negative_forwards * F * 2
    ctx = gen._context([[0, 1]], [[5, 6]])  # the chunk's pages 0, 1; its context 5, 6
    guided = ctx.with_negatives(2, scratch)
    s = scratch
    assert guided.always == [[5, 6, s[0], s[1]], [5, 6, s[2], s[3]], [5, 6, 0, 1]]
    assert guided.new_pages.tolist() == [s[0], s[1], s[2], s[3], 0, 1]
    assert ctx.with_negatives(2, scratch) is guided  # planned once a chunk
    with pytest.raises(ValueError, match="scratch"):
        gen._context([[0, 1]], [[5, 6]]).with_negatives(2, scratch[:3])
