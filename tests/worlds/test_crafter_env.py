"""crafter through Gymnasium: an episode is a pure function of its seed and actions, whatever the
env played before (crafter despawns a creature at a random index of a set, whose order followed
memory addresses until its chunks kept insertion order)."""

import copy

import numpy as np
import pytest

pytest.importorskip("crafter")

from worldstream.engine.worlds.game.env import GameEnv  # noqa: E402


def _episode(game: GameEnv, seed: int, actions: np.ndarray) -> np.ndarray:
    frames = [game.reset(seed)]
    frames += [game.step(int(a)) for a in actions]
    return np.stack(frames)


@pytest.mark.slow
def test_the_same_seed_and_actions_give_the_same_frames_after_another_episode():
    actions = np.random.default_rng(3).integers(0, 17, 400)
    fresh = GameEnv("CrafterReward-v1", size=64)
    used = GameEnv("CrafterReward-v1", size=64)
    _episode(used, 11, np.random.default_rng(4).integers(0, 17, 400))  # another world first
    want, got = _episode(fresh, 5, actions), _episode(used, 5, actions)
    assert (np.abs(np.diff(want.astype(int), axis=0)).sum((1, 2, 3)) > 0).mean() > 0.5  # it moves
    differ = np.flatnonzero((want != got).any((1, 2, 3)))
    assert differ.size == 0, f"frames part at step {differ[:1]}"


def test_a_copied_world_keeps_insertion_order_and_plays_on_identically():
    game = GameEnv("CrafterReward-v1", size=64)
    game.reset(2)
    for a in np.random.default_rng(0).integers(0, 17, 50):
        game.step(int(a))
    twin = copy.deepcopy(game)
    world, twin_world = game.env.unwrapped.env._world, twin.env.unwrapped.env._world
    assert type(twin_world) is type(world)
    for key, objs in world._chunks.items():
        assert [type(o).__name__ for o in twin_world._chunks[key]] == \
            [type(o).__name__ for o in objs]
    rest = np.random.default_rng(1).integers(0, 17, 150)
    assert all((game.step(int(a)) == twin.step(int(a))).all() for a in rest)


def test_a_snapshot_pickles_and_its_world_plays_on_identically():
    """A save point of crafter is replayed in a child process (engine.backends.game.savestate_sim),
    which sends each snapshot's copy of the env back pickled: the ordered world's class is
    found by name."""
    import pickle

    game = GameEnv("CrafterReward-v1", size=64)
    game.reset(2)
    for a in np.random.default_rng(0).integers(0, 17, 50):
        game.step(int(a))
    snap = pickle.loads(pickle.dumps(game.snapshot()))
    twin = GameEnv("CrafterReward-v1", size=64)
    twin.restore(snap)
    assert type(twin.env.unwrapped.env._world) is type(game.env.unwrapped.env._world)
    rest = np.random.default_rng(1).integers(0, 17, 150)
    assert all((game.step(int(a)) == twin.step(int(a))).all() for a in rest)
