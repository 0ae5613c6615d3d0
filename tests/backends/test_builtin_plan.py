"""The built-in backend's ``plan`` stage: each chunk's camera path from its keys, and jobs
refused at planning (tiny random models, CPU, fp32)."""

import numpy as np
import pytest

from tests.fixtures.builtin import F, exact_camera, tiny_generator
from worldstream.engine.core.backend import ChunkJob
from worldstream.engine.worlds.actions import action_to_direction
from worldstream.engine.worlds.simulator import ACCEL, FRICTION


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


def test_bad_jobs_fail_alone():
    gen = tiny_generator()
    a, b = gen.new_state("a green meadow", seed=1), gen.new_state("a snowy forest", seed=2)
    res = gen.generate([ChunkJob(a, [4, 99], steps=1), ChunkJob(b, [4, 4], steps=1)])
    assert isinstance(res[0].error, ValueError) and res[1].error is None
    with pytest.raises(ValueError):
        gen.new_state("", seed=0)
