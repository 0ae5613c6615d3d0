"""The built-in backend's ``noise`` stage: world-anchored initial noise (tiny random models,
CPU, fp32)."""

import numpy as np
import torch

from tests.fixtures.builtin import F, exact_camera, tiny_generator
from worldstream.engine.backends.builtin import noise as noise_stage
from worldstream.engine.backends.stages import replace_stage
from worldstream.engine.core.backend import ChunkJob


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
