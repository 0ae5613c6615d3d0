"""A game world (``play --env ID``) through the engine: save points hold the env's own state
(ALE ``cloneState``) and continue bit for bit, an input log with the game's keys replays bit for
bit (across episodes that end), and a log becomes a dataset of ``worldstream record``'s format
(``record --from-log``)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.fixtures.games import SHORT
from tests.studio.test_replay import record_session
from tests.studio.test_savepoint import save_load_continue
from worldstream.engine.backends.game.log_dataset import dataset_from_log
from worldstream.engine.backends.game.sim import GameEnvBackend
from worldstream.engine.core.api import ActionCommand, AdoptCommand, ForkCommand, RewindCommand
from worldstream.engine.core.backend import ChunkJob
from worldstream.engine.core.config import EngineConfig
from worldstream.engine.core.engine import Engine
from worldstream.engine.studio.replay import ReplayError, read_log, replay
from worldstream.engine.studio.savepoint import SavepointError, decode, model_version
from worldstream.engine.studio.savestate import export_state, import_state
from worldstream.engine.worlds.game import dataset

BREAKOUT = "ALE/Breakout-v5"


def _keys(seq, *keys):
    return ActionCommand(seq, 0.0, frozenset(keys))


def test_breakout_save_point_continues_bit_for_bit_and_its_log_replays():
    plan = [(2, _keys(1, "fire")), (8, _keys(2, "left")), (12, ForkCommand(3, 2)),
            (20, RewindCommand(4, 1)), (24, _keys(5, "right", "fire"))]
    config = EngineConfig(max_sessions=4, fps=40, chunk_frames=2)
    with Engine(GameEnvBackend(env=BREAKOUT), config) as engine:
        data, original, restored, loaded = save_load_continue(
            engine, 2, 40, "ignored", plan=plan, other="also ignored")
    assert original.shape == (80, 64, 64, 3)
    assert np.array_equal(original, restored)
    assert len({f.tobytes() for f in original}) > 5  # the ball moved
    arrays, _ = decode(data, GameEnvBackend(env=BREAKOUT))
    assert "now.native" in arrays  # ALE's own state, not a replay of the actions
    # the loaded session's log starts from the save point and replays with its file
    log = read_log(json.dumps(loaded["log"]))
    got = []
    replay(GameEnvBackend(env=BREAKOUT), log, got.append, savepoint=data)
    assert np.array_equal(np.concatenate(got), loaded["frames_b"])


def test_save_point_round_trip_keeps_the_rewind_history_and_refuses_another_key_map():
    backend = GameEnvBackend(env=BREAKOUT, rewind_chunks=3)
    fire, left = backend.key_action(frozenset({"fire"})), backend.key_action(frozenset({"left"}))
    state = backend.new_state("play", 9)
    for action in (fire, fire, left, left, left):
        backend.generate([ChunkJob(state, [action] * 2, 2)])
    arrays, scalars = export_state(backend, state)
    copy = import_state(backend, arrays, scalars)
    for s in (state, copy):
        backend.rewind(s, 2)
    a, b = ([backend.generate([ChunkJob(s, [left, fire, left], 2)])[0].frames for _ in range(3)]
            for s in (state, copy))
    assert np.array_equal(np.stack(a), np.stack(b))
    other = GameEnvBackend(env=BREAKOUT, keymap={"keys": {"KeyJ": "left", "Space": "fire"},
                                                 "actions": {"left": "LEFT", "fire": "FIRE"}})
    assert model_version(other) != model_version(backend)
    from worldstream.engine.studio.savepoint import SAVEPOINT_FORMAT, encode

    meta = {"format": SAVEPOINT_FORMAT, "model": backend.name,
            "model_version": model_version(backend), "state": scalars}
    with pytest.raises(SavepointError, match="another version"):
        decode(encode(arrays, meta), other)


@pytest.fixture(scope="module")
def short_session():
    """A session of the 12-step game: episodes end, a fork is adopted, a rewind."""
    plan = [(2, _keys(1, "right")), (9, _keys(2, "left")), (14, ForkCommand(3, 2)),
            (16, AdoptCommand(4, 1)), (22, RewindCommand(5, 2)), (26, _keys(6)),
            (30, _keys(7, "right"))]
    config = EngineConfig(max_sessions=2, fps=60, chunk_frames=2)
    with Engine(GameEnvBackend(env=SHORT, size=16), config) as engine:
        original, log = record_session(engine, "play", 3, plan, 48)
    return original, log


def test_a_game_log_replays_bit_identically_across_episodes(short_session):
    original, log = short_session
    assert [e["keys"] for e in log["events"] if e["kind"] == "action"] == [
        ["right"], ["left"], [], ["right"]]
    parsed = read_log(json.dumps(log))
    got = []
    replay(GameEnvBackend(env=SHORT, size=16), parsed, got.append)
    assert np.array_equal(np.concatenate(got), original)
    # the episode clock (row 0) ran out and restarted within the stream
    clock = (original[:, 0, :, 0] == 255).sum(axis=1)
    assert (np.diff(clock) < 0).any()
    with pytest.raises(ReplayError, match="another version"):
        replay(GameEnvBackend(env=SHORT, size=16, keymap={
            "keys": {"KeyJ": "left", "KeyL": "right"},
            "actions": {"left": "RIGHT", "right": "LEFT"}}), parsed, got.append)


def test_a_game_log_becomes_a_dataset_of_the_stream(short_session, tmp_path):
    original, log = short_session
    out = tmp_path / "data"
    meta = dataset_from_log(json.dumps(log).encode(), out, shard_frames=10_000,
                            backend=GameEnvBackend(env=SHORT, size=16))
    assert meta["env"] == SHORT and meta["policy"] == "log" and meta["size"] == 16
    shards = [np.load(p) for p in sorted(out.glob("shard-*.npz"))]
    # one shard per continuous stretch (the adopt and the rewind jumped): dropping each one's
    # first frame (where the stretch began) leaves exactly the stream
    assert len(shards) == 3
    stream = np.concatenate([s["frames"][1:] for s in shards])
    assert np.array_equal(stream, original)
    for shard in shards:  # each action moved the dot as the game does, -1 where none was taken
        frames, actions = shard["frames"], shard["actions"]
        x = frames[:, 8, :, 0].argmax(axis=1)
        for t in np.flatnonzero(actions >= 0):
            assert x[t + 1] == np.clip(x[t] + (0, -1, 1)[actions[t]], 0, 15)
        assert actions[-1] == -1
    _, episodes = dataset.load(out, env_id=SHORT)
    assert len(episodes) == meta["frames"] and len(episodes.seeds) >= 4
    with pytest.raises(ValueError, match="not an empty folder"):
        dataset_from_log(json.dumps(log).encode(), out)


def test_from_log_refuses_a_log_of_another_world(tmp_path):
    log = {"format": "worldstream-input-log/1", "model": "sim", "model_version": "0",
           "start": {"kind": "prompt"}, "seed": 0, "prompt": "a snowy forest",
           "chunk_frames": 2, "steps": 2, "fps": 20, "chunks": 2, "frames": 4, "events": []}
    with pytest.raises(ValueError, match="not a game world"):
        dataset_from_log(json.dumps(log).encode(), tmp_path / "out")
    bad = dict(log, model=f"game-sim:{SHORT}",
               events=[{"kind": "action", "chunk": 0, "frame": 0, "keys": ["Fire!"]}])
    with pytest.raises(ValueError, match="events.0.action.keys.0"):
        dataset_from_log(json.dumps(bad).encode(), tmp_path / "out")
    assert not (tmp_path / "out").exists()
