"""The built-in backend's spatial-memory side of a chunk (``memory``): start frames kept, how
far inside new ground is rewritten (tiny random models, CPU, fp32)."""

import numpy as np
import pytest

from tests.fixtures.builtin import F, exact_camera, tiny_generator
from worldstream.engine.backends.builtin import BuiltinConfig
from worldstream.engine.core.backend import ChunkJob
from worldstream.engine.models.builtin.spatial_memory import centre_box


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
                new = np.where(gen.exclude, canvas[ys, xs], np.maximum(canvas[ys, xs], seen))
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
