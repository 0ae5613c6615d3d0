"""The procedural world: determinism, motion that follows the keys with inertia, scenes."""

import numpy as np
import pytest

from worldstream.engine.evaluation.metrics import image_shift
from worldstream.engine.worlds.actions import (
    IDLE,
    action_to_direction,
    direction_to_action,
    keys_to_action,
)
from worldstream.engine.worlds.recorder import PROMPTS, load_shard, record_shard
from worldstream.engine.worlds.scenes import SCENE_NAMES, SCENES, palette
from worldstream.engine.worlds.simulator import WorldSimulator


def play(seed, actions, scene="meadow"):
    sim = WorldSimulator(seed, scene)
    return np.stack([sim.step(a) for a in actions]), sim


def test_same_seed_and_actions_give_identical_frames():
    acts = [1, 1, 5, 5, 8, 4, 0, 3] * 3
    a, _ = play(42, acts)
    b, _ = play(42, acts)
    c, _ = play(43, acts)
    assert a.shape == (24, 128, 128, 3) and a.dtype == np.uint8
    assert np.array_equal(a, b) and not np.array_equal(a, c)


def test_keys_map_to_directions():
    assert keys_to_action([]) == IDLE
    assert action_to_direction(keys_to_action(["right"])) == (1, 0)
    assert action_to_direction(keys_to_action(["up", "left"])) == (-1, -1)
    assert keys_to_action(["up", "down"]) == IDLE  # opposite keys cancel
    with pytest.raises(ValueError, match="jump"):
        keys_to_action(["jump"])
    with pytest.raises(ValueError):
        action_to_direction(9)


def test_camera_accelerates_then_coasts_and_content_moves_against_it():
    right = direction_to_action(1, 0)
    frames, sim = play(3, [right] * 20 + [IDLE] * 25)
    speeds = []
    for i in range(1, 45):
        dx, dy = image_shift(frames[i - 1], frames[i])
        speeds.append(-dx)
        assert abs(dy) < 0.6
    assert speeds[0] < speeds[10]  # acceleration: not a copy of the keys
    assert 4.0 <= max(speeds) <= 7.0  # a few pixels per frame
    assert speeds[20] > 0.5  # inertia: still moving after release
    assert abs(speeds[-1]) < 0.6  # and then it stops


def test_scenes_are_distinct_and_have_paraphrases():
    assert len(SCENE_NAMES) >= 4
    means = []
    for s in SCENE_NAMES:
        assert len(SCENES[s]["prompts"]) >= 10
        means.append(play(5, [IDLE] * 2, s)[0][-1].reshape(-1, 3).mean(0))
    d = np.linalg.norm(np.array(means)[:, None] - np.array(means)[None], axis=-1)
    assert d[~np.eye(len(means), dtype=bool)].min() > 25
    with pytest.raises(KeyError, match="volcano"):
        palette("volcano")


def test_scene_switch_cross_fades():
    sim = WorldSimulator(9, "meadow")
    before = sim.step(IDLE).astype(float)
    sim.set_scene("night")
    mids = [sim.step(IDLE).astype(float).mean() for _ in range(12)]
    after = sim.step(IDLE).astype(float)
    assert before.mean() > mids[2] > mids[8] > after.mean()


def test_world_is_animated_when_idle():
    frames, _ = play(11, [IDLE] * 30)
    assert not np.array_equal(frames[10], frames[29])


def test_recorder_writes_shards(tmp_path):
    record_shard(tmp_path / "s", [1, 2], length=12, switch_prob=0.5)
    d = load_shard(tmp_path / "s")
    assert d["frames"].shape == (2, 12, 128, 128, 3)
    assert d["actions"].shape == d["prompt"].shape == d["switch"].shape == (2, 12)
    assert d["switch"].any()
    assert d["camera"].shape == (2, 12, 2)
    assert all(0 <= p < len(PROMPTS) for p in np.asarray(d["prompt"]).ravel())
    with pytest.raises(FileNotFoundError, match="frames.npy"):
        load_shard(tmp_path / "missing")


def test_recorded_camera_path_is_the_frame_shift(tmp_path):
    # where the camera moved by (dx, dy) px, frame t+1 equals frame t shifted back by it on all
    # static terrain (creatures, clouds, water and the sprite move on their own)
    d = load_shard(record_shard(tmp_path / "s", [5], length=24, switch_prob=0.0))
    frames, cam = np.asarray(d["frames"][0], np.int16), np.asarray(d["camera"][0])
    moved = 0
    for t in range(len(frames) - 1):
        dx, dy = cam[t + 1] - cam[t]
        if (dx, dy) == (0, 0) or max(abs(dx), abs(dy)) > 20:
            continue
        a = frames[t][max(dy, 0) : 128 + min(dy, 0), max(dx, 0) : 128 + min(dx, 0)]
        b = frames[t + 1][max(-dy, 0) : 128 + min(-dy, 0), max(-dx, 0) : 128 + min(-dx, 0)]
        unshifted = np.mean(np.abs(frames[t + 1] - frames[t]) <= 8)
        assert np.mean(np.abs(a - b) <= 8) > max(0.6, unshifted + 0.1)
        moved += 1
    assert moved >= 5
