"""SimBackend against a WorldSimulator stepped by hand with the same seed, scene and actions."""

from __future__ import annotations

import numpy as np
import pytest

from worldstream.engine.backends.sim.backend import SimBackend
from worldstream.engine.core.backend import ChunkJob
from worldstream.engine.worlds.actions import keys_to_action
from worldstream.engine.worlds.simulator import WorldSimulator

SCENES = {"snow": "snow", "desert": "desert"}
UP, RIGHT, IDLE = keys_to_action({"up"}), keys_to_action({"right"}), keys_to_action(())


def _scene_for(prompt: str) -> str:
    """A stand-in for the embedding lookup: keyword -> scene, else meadow."""
    return next((scene for word, scene in SCENES.items() if word in prompt), "meadow")


def _backend(**kw) -> SimBackend:
    return SimBackend(scene_for=_scene_for, **kw)


def _run(backend, state, actions, steps=2):
    (result,) = backend.generate([ChunkJob(state, list(actions), steps)])
    assert result.error is None
    return result.frames


def test_frames_equal_hand_stepped_simulator_and_batching_changes_nothing():
    backend = _backend()
    a, b = backend.new_state("a snowy plain", 7), backend.new_state("a meadow", 8)
    ref_a, ref_b = WorldSimulator(7, "snow"), WorldSimulator(8, "meadow")
    scripts = [[UP, UP], [RIGHT, IDLE], [RIGHT, RIGHT]]
    for actions in scripts:
        res_a, res_b = backend.generate([ChunkJob(a, actions, 4), ChunkJob(b, actions[::-1], 1)])
        assert res_a.frames.shape == (2, 128, 128, 3) and res_a.frames.dtype == np.uint8
        assert set(res_a.stages_ms) == {"simulate"}
        np.testing.assert_array_equal(res_a.frames, np.stack([ref_a.step(x) for x in actions]))
        np.testing.assert_array_equal(res_b.frames,
                                      np.stack([ref_b.step(x) for x in actions[::-1]]))


def test_rewind_restores_the_world_of_n_chunks_ago():
    backend = _backend(rewind_chunks=3)
    state = backend.new_state("meadow", 3)
    chunks = [_run(backend, state, [a, a]) for a in (UP, RIGHT, UP, RIGHT)]
    assert len(state.history) == 3  # bounded
    with pytest.raises(ValueError, match="1..3"):
        backend.rewind(state, 4)
    backend.rewind(state, 2)
    # replaying the same actions reproduces the same frames
    np.testing.assert_array_equal(_run(backend, state, [UP, UP]), chunks[2])
    np.testing.assert_array_equal(_run(backend, state, [RIGHT, RIGHT]), chunks[3])


def test_fork_is_independent():
    backend = _backend()
    state = backend.new_state("desert dunes", 5)
    _run(backend, state, [UP, UP])
    twin = backend.fork(state)
    ref = WorldSimulator(5, "desert")
    ref.step(UP), ref.step(UP)
    ref_twin = WorldSimulator(5, "desert")
    ref_twin.step(UP), ref_twin.step(UP)
    np.testing.assert_array_equal(_run(backend, twin, [RIGHT] * 3),
                                  np.stack([ref_twin.step(RIGHT) for _ in range(3)]))
    np.testing.assert_array_equal(_run(backend, state, [UP] * 3),
                                  np.stack([ref.step(UP) for _ in range(3)]))
    backend.rewind(twin, 2)  # the twin inherited the history of the chunk before the fork
    np.testing.assert_array_equal(twin.sim.render(), WorldSimulator(5, "desert").render())


def test_prompt_switch_and_blend_pick_the_heavier_scene():
    backend = _backend()
    state = backend.new_state("a meadow", 1)
    backend.set_prompt(state, "snow field")
    assert state.scene == "snow"
    backend.set_prompt(state, "snow field", blend_text="desert", blend_weight=0.7)
    assert state.scene == "desert"
    backend.set_prompt(state, "snow field", blend_text="desert", blend_weight=0.3)
    assert state.scene == "snow"
    with pytest.raises(ValueError, match="blend weight"):
        backend.set_prompt(state, "meadow", blend_text="desert", blend_weight=1.5)
    with pytest.raises(ValueError, match="non-empty"):
        backend.set_prompt(state, "  ")
    assert state.scene == "snow"
    # the frames cross-fade exactly like the simulator's own scene switch
    ref = WorldSimulator(1, "meadow")
    for scene in ("snow", "desert", "snow"):
        ref.set_scene(scene)
    np.testing.assert_array_equal(_run(backend, state, [IDLE, IDLE]),
                                  np.stack([ref.step(IDLE), ref.step(IDLE)]))


def test_default_scene_lookup_uses_prompt_embeddings():
    backend = SimBackend()  # engine.models.builtin.text.scene_for_prompt (loads the text encoder)
    assert backend.new_state("a sandy desert with dunes", 0).scene == "desert"


def test_free_and_bad_jobs_are_isolated():
    # NOTE: the state budget is the engine's (tests/core/test_engine.py), not the backend's
    backend = _backend(max_states=2)
    a = backend.new_state("meadow", 1)
    b = backend.fork(a)
    backend.free(b)
    backend.free(b)  # idempotent
    c = backend.new_state("meadow", 2)
    before = a.sim.render()
    results = backend.generate([ChunkJob(a, [UP, 99], 2), ChunkJob(b, [UP], 2),
                                ChunkJob(c, [UP], 5), ChunkJob(c, [UP], 2)])
    assert [r.error is not None for r in results] == [True, True, True, False]
    assert "action id" in str(results[0].error) and results[0].frames is None
    np.testing.assert_array_equal(a.sim.render(), before)  # the bad chunk moved nothing
    np.testing.assert_array_equal(results[3].frames[0], WorldSimulator(2, "meadow").step(UP))
    with pytest.raises(ValueError, match="non-empty"):
        backend.new_state("", 0)
