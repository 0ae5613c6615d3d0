"""GameEnvBackend (``--env ID --model sim``): the real game behind the WorldBackend contract.
Determinism, rewind and fork exactness, episodes that end, key maps and bad envs."""

from __future__ import annotations

import numpy as np
import pytest

from tests.fixtures.games import CONTINUOUS, NO_IMAGE, SHORT
from worldstream.engine.backends.game.sim import GameEnvBackend, episode_seed
from worldstream.engine.core.backend import ChunkJob
from worldstream.engine.core.registry import backend_id, env_backend_id, load_backend
from worldstream.engine.worlds.game.env import GameEnv, GameEnvError
from worldstream.engine.worlds.game.keymap import KeyMapError

BREAKOUT = "ALE/Breakout-v5"


@pytest.fixture(scope="module")
def breakout():
    backend = GameEnvBackend(env=BREAKOUT, rewind_chunks=4)
    yield backend
    backend.close()


def _run(backend, state, actions):
    (result,) = backend.generate([ChunkJob(state, list(actions), 2)])
    assert result.error is None, result.error
    return result


def _script(backend):
    """Fire to serve, then hold left and right in turn: 40 frames in chunks of 2."""
    act = {k: backend.key_action(frozenset(k)) for k in ((), ("fire",), ("left",), ("right",))}
    plan = [act[("fire",)]] * 4 + [act[("left",)]] * 12 + [act[()]] * 4 + [act[("right",)]] * 20
    return [plan[i:i + 2] for i in range(0, len(plan), 2)]


def test_same_seed_and_actions_give_identical_frames_twice(breakout):
    runs = []
    for _ in range(2):
        state = breakout.new_state("ignored: a game has no prompt", 5)
        runs.append(np.concatenate([_run(breakout, state, c).frames for c in _script(breakout)]))
        breakout.free(state)
    assert runs[0].shape == (40, 64, 64, 3) and runs[0].dtype == np.uint8
    assert np.array_equal(runs[0], runs[1])
    assert len({f.tobytes() for f in runs[0]}) > 10  # the game moved
    # the frames are the env's own, stepped by hand
    game = GameEnv(BREAKOUT)
    game.reset(episode_seed(5, 0))
    by_hand = [game.step(a).copy() for chunk in _script(breakout) for a in chunk]
    game.close()
    assert np.array_equal(np.stack(by_hand), runs[0])


def test_rewind_is_exact_and_bounded(breakout):
    state = breakout.new_state("play", 2)
    chunks = [_run(breakout, state, c).frames for c in _script(breakout)[:8]]
    assert len(state.history) == 4
    with pytest.raises(ValueError, match="1..4"):
        breakout.rewind(state, 5)
    breakout.rewind(state, 3)
    for i, chunk in enumerate(_script(breakout)[5:8]):
        assert np.array_equal(_run(breakout, state, chunk).frames, chunks[5 + i])
    breakout.free(state)


def test_a_fork_is_independent(breakout):
    state = breakout.new_state("play", 3)
    script = _script(breakout)
    for chunk in script[:6]:
        _run(breakout, state, chunk)
    branch = breakout.fork(state)
    left = breakout.key_action(frozenset({"left"}))
    right = breakout.key_action(frozenset({"right"}))
    ahead = [_run(breakout, branch, [left, left]).frames for _ in range(4)]
    original = [_run(breakout, state, [right, right]).frames for _ in range(4)]
    assert not np.array_equal(np.stack(ahead), np.stack(original))
    breakout.rewind(state, 4)  # the original's own history is untouched by the branch
    again = [_run(breakout, state, [left, left]).frames for _ in range(4)]
    assert np.array_equal(np.stack(again), np.stack(ahead))
    breakout.free(branch)
    breakout.free(state)
    breakout.free(state)  # idempotent
    (result,) = breakout.generate([ChunkJob(state, [0], 2)])
    assert "freed" in str(result.error)


def test_keys_controls_and_no_prompt(breakout):
    assert breakout.name == "game-sim:ALE/Breakout-v5" and breakout.world == "game"
    assert breakout.wire_keys == ("fire", "left", "right")
    assert breakout.controls["keys"]["Space"] == "fire"
    assert breakout.controls["actions"]["left"] == "LEFT"
    with pytest.raises(ValueError, match="not keys of this game"):
        breakout.key_action(frozenset({"up"}))
    state = breakout.new_state("play", 0)
    with pytest.raises(ValueError, match="no text prompt"):
        breakout.set_prompt(state, "a snowy forest")
    (bad,) = breakout.generate([ChunkJob(state, [7], 2)])
    assert isinstance(bad.error, ValueError)
    breakout.free(state)


def test_an_episode_that_ends_starts_the_next_with_an_event():
    backend = GameEnvBackend(env=SHORT, size=16)  # episodes of 12 steps
    state = backend.new_state("play", 4)
    results = [_run(backend, state, [2, 2, 2]) for _ in range(5)]
    events = [e for r in results for e in r.events]
    assert events == [("episode", {"episode": 1, "seed": 5, "reason": "game over",
                                   "message": "game over: episode 2 begins"})]
    frames = np.concatenate([r.frames for r in results])
    # frame 12 ends episode 0; frame 13 is the first frame of episode 1 (seed 5: column 6)
    assert frames[12][8].argmax(0)[0] == 6 and frames[12][0].sum() == 0
    assert state.episode == 1
    # rewinding across the episode boundary restores episode and game exactly
    backend.rewind(state, 2)
    assert state.episode == 0
    again = np.concatenate([_run(backend, state, [2, 2, 2]).frames for _ in range(2)])
    assert np.array_equal(again, frames[9:15])


def test_the_registry_plays_games_on_the_world_and_model_axes():
    assert env_backend_id("ALE/Pong-v5") == "game-sim:ALE/Pong-v5"
    assert backend_id("pong", "sim") == "game-sim:ALE/Pong-v5"
    assert backend_id("breakout", "sim") == "game-sim:ALE/Breakout-v5"
    backend = load_backend(env_backend_id(SHORT), size=16)
    assert backend.env_id == SHORT and backend.action_meanings == ("NOOP", "LEFT", "RIGHT")
    with pytest.raises(ValueError, match="no model 'wan-causal' for a game"):
        env_backend_id("ALE/Pong-v5", "wan-causal")
    with pytest.raises(ValueError, match="takes no --model-path"):
        load_backend("game-sim:ALE/Pong-v5", model_path="x")


@pytest.mark.parametrize("env, message", [
    ("ALE/NoSuchGame-v5", "unknown env id 'ALE/NoSuchGame-v5'"),
    (CONTINUOUS, "needs a discrete one"),
    (NO_IMAGE, "no image observation"),
    ("no_such_module:make", "cannot import module"),
])
def test_bad_envs_are_one_line(env, message):
    with pytest.raises(GameEnvError, match=message) as err:
        GameEnvBackend(env=env)
    assert "\n" not in str(err.value)


def test_a_key_map_naming_an_action_the_env_lacks():
    with pytest.raises(KeyMapError, match="'JUMP', which env"):
        GameEnvBackend(env=SHORT, size=16,
                       keymap={"keys": {"Space": "fire"}, "actions": {"fire": "JUMP"}})
    backend = GameEnvBackend(env=SHORT, size=16, keymap={
        "keys": {"KeyJ": "left", "KeyL": "right"}, "actions": {"left": "LEFT", "right": 2}})
    assert backend.controls["keys"] == {"KeyJ": "left", "KeyL": "right"}
    assert backend.key_action(frozenset({"right"})) == 2


def test_snapshots_hold_actions_as_one_compact_array(breakout):
    """Each rewind snapshot's actions are a read-only int16 view of one episode array (bytes,
    not a tuple of ints per snapshot); a rewind and a save point's round trip restore them
    exactly, and the next steps never write into a snapshot's array."""
    from worldstream.engine.studio.savestate import export_state, import_state

    state = breakout.new_state("play", 4)
    script = _script(breakout)
    for chunk in script[:6]:
        _run(breakout, state, chunk)
    snaps = [snap for snap, _ in state.history]
    for snap in snaps:
        assert isinstance(snap.actions, np.ndarray) and snap.actions.dtype == np.int16
        assert not snap.actions.flags.writeable
    assert len({id(s.actions.base) for s in snaps}) == 1  # one buffer, views
    played = [a for chunk in script[:6] for a in chunk]
    kept = [s.actions.copy() for s in snaps]
    breakout.rewind(state, 3)
    assert state.game.actions.tolist() == played[:6]
    for chunk in script[3:6]:  # replayed after the rewind: the snapshots' arrays unchanged
        _run(breakout, state, [1 - a if a in (0, 1) else a for a in chunk])
    assert all(np.array_equal(s.actions, k) for s, k in zip(snaps, kept, strict=True))
    arrays, scalars = export_state(breakout, state)
    loaded = import_state(breakout, arrays, scalars)
    now = loaded.game.snapshot()
    assert now.actions.dtype == np.int16
    assert np.array_equal(now.actions, state.game.actions)
    bases = {id(s.actions.base) for s, _ in loaded.history} | {id(now.actions.base)}
    assert len(bases) == 1  # the loaded history: views of the longest snapshot's array
    expected = loaded.history[-2][0].actions.copy()
    breakout.rewind(loaded, 2)
    assert np.array_equal(loaded.game.actions, expected)
    breakout.free(loaded)
    breakout.free(state)


@pytest.mark.slow
def test_a_crafter_episode_started_ahead_plays_as_one_reset_here():
    # crafter generates a world in ~0.75 s of pure Python at each game over: made ahead in
    # another process and restored, it must show exactly what a reset on the engine thread does
    pytest.importorskip("crafter")
    actions = np.random.default_rng(5).integers(0, 17, 150)
    frames, resets = {}, {}
    for ahead in (True, False):
        backend = GameEnvBackend(env="CrafterReward-v1")
        assert backend.starts_ahead
        backend.starts_ahead = ahead
        state = backend.new_state("play", 3)
        state.game.max_episode_steps = 40  # a game over every 41 frames
        real, resets[ahead] = state.game.reset, []
        state.game.reset = lambda seed, real=real, seen=resets[ahead]: (seen.append(seed),
                                                                         real(seed))[1]
        out = []
        for action in actions:
            if state.next_start is not None:
                state.next_start[1].result(timeout=300)  # ready before its game over
            out.append(backend.step(state, int(action))[0])
        frames[ahead] = np.stack(out)
        backend.free(state)
        backend.close()
    assert resets[True] == [] and resets[False] == [episode_seed(3, e) for e in (1, 2, 3)]
    assert (np.abs(np.diff(frames[False].astype(int), axis=0)).sum((1, 2, 3)) > 0).mean() > 0.5
    differ = np.flatnonzero((frames[True] != frames[False]).any((1, 2, 3)))
    assert differ.size == 0, f"frames part at step {differ[:1]}"
