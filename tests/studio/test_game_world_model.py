"""A game's learned world (``play --env ID --model-path DIR``) through the engine: a save point
continues bit for bit (with its rewind history), one made with other weights is refused, and the
input log of a live session (fork adopted, rewind) replays bit for bit."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.fixtures.game_world import other_weights_folder, tiny_world_folder
from tests.fixtures.tiny_game import TINY
from tests.studio.test_replay import record_session
from tests.studio.test_savepoint import save_load_continue
from worldstream.engine.backends.game.log_dataset import dataset_from_log
from worldstream.engine.backends.game.world import GameWorldBackend
from worldstream.engine.core.api import ActionCommand, AdoptCommand, ForkCommand, RewindCommand
from worldstream.engine.core.backend import ChunkJob
from worldstream.engine.core.config import EngineConfig
from worldstream.engine.core.engine import Engine
from worldstream.engine.studio.replay import ReplayError, read_log, replay
from worldstream.engine.studio.savepoint import SavepointError, decode, model_version, read_meta
from worldstream.engine.studio.savestate import export_state, import_state


def _keys(seq, *keys):
    return ActionCommand(seq, 0.0, frozenset(keys))


@pytest.fixture(scope="module")
def folder():
    return tiny_world_folder()


def _backend(folder, **kwargs):
    return GameWorldBackend(env=TINY, path=folder, **kwargs)


def test_a_save_point_continues_bit_for_bit_and_other_weights_refuse_it(folder, tmp_path):
    plan = [(2, _keys(1, "right")), (8, _keys(2, "left")), (12, ForkCommand(3, 2)),
            (20, RewindCommand(4, 1)), (24, _keys(5, "right"))]
    config = EngineConfig(max_sessions=4, fps=40, chunk_frames=2)
    with Engine(_backend(folder), config) as engine:
        data, original, restored, loaded = save_load_continue(
            engine, 1, 40, "ignored", plan=plan, other="also ignored")
    assert original.shape == (40, 16, 16, 3)
    assert np.array_equal(original, restored)
    assert len({f.tobytes() for f in original}) > 10  # the world moved
    state = read_meta(data)["state"]
    assert state["seed"] == 3 and state["history"] >= 1
    # the loaded session's log starts from the save point and replays with its file
    got = []
    replay(_backend(folder), read_log(json.dumps(loaded["log"])), got.append, savepoint=data)
    assert np.array_equal(np.concatenate(got), loaded["frames_b"])
    # other weights (one bias moved by 1e-3), or another precision: another model version
    other = _backend(other_weights_folder(folder, tmp_path / "other"))
    assert model_version(other) != model_version(_backend(folder))
    with pytest.raises(SavepointError, match="another version"):
        decode(data, other)
    assert model_version(_backend(folder, bf16=False)) != model_version(
        _backend(folder, bf16=True))


def test_the_state_round_trip_keeps_the_history_and_refuses_what_does_not_fit(folder):
    backend = _backend(folder, rewind_chunks=3)
    state = backend.new_state("play", 9)
    for actions in ([2, 2], [1], [0, 1, 2], [2], [1, 1]):
        backend.generate([ChunkJob(state, actions, 1)])
    arrays, scalars = export_state(backend, state)
    assert scalars["history"] == 3 and arrays["now.frames"].shape == (4, 16, 16)
    copy = import_state(backend, arrays, scalars)
    for s in (state, copy):
        backend.rewind(s, 2)
    a, b = ([backend.generate([ChunkJob(s, [1, 2, 0], 1)])[0].frames for _ in range(3)]
            for s in (state, copy))
    assert np.array_equal(np.stack(a), np.stack(b))
    # each context keeps the frame index its next frame's outcome is drawn at: 1 + 2 + ...
    assert [int(arrays[f"{p}.step"][0]) for p in ["history.0", "history.1", "history.2",
                                                   "now"]] == [3, 6, 7, 9]
    # a save from before the outcome code has no frame index: it reads as 0
    older = {k: v for k, v in arrays.items() if not k.endswith(".step")}
    got = import_state(backend, older, scalars)
    assert got.step == 0 and [h[2] for h in got.history] == [0, 0, 0]
    assert np.array_equal(got.frames, arrays["now.frames"])
    with pytest.raises(SavepointError, match="now.step"):
        import_state(backend, dict(arrays, **{"now.step": np.array([-1], np.int64)}), scalars)
    bad = dict(arrays, **{"now.frames": np.full((4, 16, 16), 200, np.uint8)})
    with pytest.raises(SavepointError, match="palette indices"):
        import_state(backend, bad, scalars)
    with pytest.raises(SavepointError, match="lacks the array 'history.2.frames'"):
        import_state(backend, {k: v for k, v in arrays.items() if "history.2" not in k},
                     scalars)
    with pytest.raises(SavepointError, match="keeps 2"):
        import_state(_backend(folder, rewind_chunks=2), arrays, scalars)


def test_a_live_sessions_log_replays_bit_for_bit(folder):
    plan = [(2, _keys(1, "right")), (9, _keys(2, "left")), (14, ForkCommand(3, 2)),
            (16, AdoptCommand(4, 1)), (22, RewindCommand(5, 2)), (26, _keys(6)),
            (30, _keys(7, "right"))]
    config = EngineConfig(max_sessions=2, fps=60, chunk_frames=2)
    with Engine(_backend(folder), config) as engine:
        original, log = record_session(engine, "play", 3, plan, 48)
    assert log["model"] == f"game-builtin:{TINY}"
    parsed = read_log(json.dumps(log))
    got = []
    replay(_backend(folder), parsed, got.append)
    assert np.array_equal(np.concatenate(got), original)
    with pytest.raises(ReplayError, match="another version"):
        replay(_backend(folder, keymap={"keys": {"KeyJ": "left", "KeyL": "right"},
                                        "actions": {"left": "RIGHT", "right": "LEFT"}}),
               parsed, got.append)
    # a learned world's frames are not the game's: no dataset from its log
    with pytest.raises(ValueError, match="learned world"):
        dataset_from_log(json.dumps(log).encode(), folder.parent / "data-from-log")
