"""The built-in backend under torch.compile: compiled streams equal eager ones without
recompiling, the attention op's bound context, the eager fallback."""

import shutil

import numpy as np
import pytest
import torch

from tests.fixtures.builtin import tiny_generator
from worldstream.engine.backends.builtin import BuiltinBackend, BuiltinConfig
from worldstream.engine.core.backend import ChunkJob
from worldstream.engine.models.builtin import attention
from worldstream.engine.models.builtin.autoencoder import build_autoencoder
from worldstream.engine.models.builtin.world_dit import WorldDiT


@pytest.mark.slow
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


@pytest.mark.slow
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
