"""The built-in backend's KV pages (``select_pages`` and the page pool): the window, spatial
pages, forks and rewinds, recaching, scratch pages, pages returned on failure (tiny random
models, CPU, fp32)."""

import numpy as np
import pytest
import torch

from tests.fixtures.builtin import F, exact_camera, tiny_generator
from worldstream.engine.backends.builtin import BuiltinConfig
from worldstream.engine.backends.builtin import pages as pages_stage
from worldstream.engine.backends.builtin.pages import attended
from worldstream.engine.core.backend import ChunkJob
from worldstream.engine.worlds.actions import action_to_direction


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
    context = gen.attention_context
    gen.attention_context = lambda pages, contexts, *a, **k: seen.append(contexts) or context(
        pages, contexts, *a, **k)
    gen.generate([ChunkJob(state, [4] * F, 1, seed=9)])
    assert len(seen[0][0]) == 2 * F  # the denoise attends the narrowed window only


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


def test_negative_rows_write_to_scratch_pages_outside_the_allocator():
    """A batched guided forward's negative rows attend their conditional row's pages with the
    chunk's own pages swapped for scratch pages, which lie past the allocator's pages (never
    handed to a stream); too few scratch pages is an error."""
    gen = tiny_generator(guidance=2.0, max_states=2)
    scratch = gen.scratch_pages
    assert scratch == list(range(gen.allocator.num_pages, gen.k_pool.shape[1]))
    assert len(scratch) == gen.negative_forwards * F * 2
    ctx = gen.attention_context([[0, 1]], [[5, 6]])  # the chunk's pages 0, 1; its context 5, 6
    guided = ctx.with_negatives(2, scratch)
    s = scratch
    assert guided.always == [[5, 6, s[0], s[1]], [5, 6, s[2], s[3]], [5, 6, 0, 1]]
    assert guided.new_pages.tolist() == [s[0], s[1], s[2], s[3], 0, 1]
    assert ctx.with_negatives(2, scratch) is guided  # planned once a chunk
    with pytest.raises(ValueError, match="scratch"):
        gen.attention_context([[0, 1]], [[5, 6]]).with_negatives(2, scratch[:3])
