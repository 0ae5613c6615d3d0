"""The built-in backend's ``denoise`` stage: the first step from memory, step cost, prompt,
action and steady guidance against the dense reference (tiny random models, CPU, fp32)."""

import numpy as np
import pytest
import torch

from tests.fixtures.builtin import (
    F,
    dense_last_chunk,
    prompt_guided_reference,
    record_sigmas,
    tiny_generator,
)
from worldstream.engine.backends.builtin import BuiltinBackend, BuiltinConfig, guidance
from worldstream.engine.core.backend import ChunkJob
from worldstream.engine.models.builtin.autoencoder import build_autoencoder
from worldstream.engine.models.builtin.world_dit import WorldDiT


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
        c, guided = prompt_guided_reference(gen, recs, last, text, g_scale)
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
        c = dense_last_chunk(gen, recs, last, text)
        want = c
        if any(a != idle for a in recs[last].actions):
            neutral = acts[:-F] + [idle] * F
            want = want + (g_act - 1) * (c - dense_last_chunk(gen, recs, last, text, neutral))
        if recs[last].guided:
            free = text.clone()
            free[:, -F:] = 0
            want = want + (g_txt - 1) * (c - dense_last_chunk(gen, recs, last, free))
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
        c, want = prompt_guided_reference(gen, recs, last, text, g_scale)
        assert torch.allclose(want, recs[last].latents, atol=1e-4)
        assert (c - recs[last].latents).abs().max() > 1e-2
    seen = []
    forward = gen.forward

    def spy(x, sigma, cond, ctx):  # each row: is its text dropped?
        seen.append((round(float(sigma), 3), tuple(bool((t == 0).all()) for t in cond[4])))
        return forward(x, sigma, cond, ctx)

    gen.forward = spy
    (res,) = gen.generate([ChunkJob(state, [2, 2], steps=2, seed=200)])
    assert res.error is None
    gen.finish()
    denoise = [s for s in seen if s[0] > gen.config.ctx_sigma]  # the cache fill runs at ctx σ
    assert denoise == ([(1.0, (True, False)), (0.5, (False,))] if batched else
                       [(1.0, (True,)), (1.0, (False,)), (0.5, (False,))])
    with pytest.raises(ValueError, match="steady_guidance_sigma"):
        BuiltinConfig(steady_guidance_sigma=0.0)
