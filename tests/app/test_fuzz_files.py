"""Files users send each other are data (issue 64): an input log or a save file never imports
code, and a save point is checked against the world it loads into before anything changes.

Each input the issue found is a test of its own: a log naming an importable
``MODULE:FACTORY`` (``record --from-log``, ``generate --replay``: exit 2, one line, nothing
imported), ``--env`` ids of ``__main__`` and private modules, save points with out-of-range or
unknown fields per world family (the simulator, the learned built-in, the game's env, the
game's learned world; over HTTP on Pong: 400 and the session goes on as it was), a list of
actions longer than an episode (refused from the header, before any array is decoded), a
save of a game without emulator state (replayed off the engine thread, bounded) and a long
``record --from-log`` (shards written as it plays). The fuzz cases: any model id a file names
(300), any edited field of a save file of the simulator (60). ~15 s on 2 cores.
"""

from __future__ import annotations

import json
import math
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.app.test_fuzz import FUZZ, values
from tests.fixtures.files import COPIED, TRIPWIRE, CopiedGame
from tests.fixtures.games import SHORT
from tests.fixtures.server import auth, create
from worldstream.app.cli import main
from worldstream.app.server import create_app
from worldstream.engine.backends.game import log_dataset as game_log
from worldstream.engine.backends.game import savestate_sim as savestate_game
from worldstream.engine.backends.game.sim import GameEnvBackend
from worldstream.engine.backends.sim.backend import SimBackend
from worldstream.engine.core import registry
from worldstream.engine.core.backend import ChunkJob
from worldstream.engine.core.config import EngineConfig
from worldstream.engine.core.engine import Engine
from worldstream.engine.core.inputlog import LOG_FORMAT
from worldstream.engine.studio import savepoint
from worldstream.engine.studio.savepoint import MAX_SAVEPOINT_BYTES, SavepointError
from worldstream.engine.studio.savestate import export_state, import_state, prepare_import
from worldstream.engine.worlds.game.env import GameEnv, GameEnvError
from worldstream.streaming.limits import Limits

PONG = "ALE/Pong-v5"


def one_line(err: BaseException) -> None:
    text = str(err)
    assert text and "\n" not in text and "Traceback" not in text, text


# ---------------------------------------------------------------- files never import code
def _log(model: str) -> dict:
    return {"format": LOG_FORMAT, "model": model, "model_version": "0" * 64,
            "start": {"kind": "prompt"}, "seed": 0, "prompt": "play", "chunk_frames": 1,
            "steps": 1, "fps": 15, "chunks": 1, "frames": 1, "events": []}


#: the issue's (huggingface_hub:logout deleted a token; _pytest.config:main ran a
#: conftest.py; f2py's command line ran on import) and a module that records its import
HOSTILE_MODELS = [f"game-sim:{TRIPWIRE}", f"game-builtin:{TRIPWIRE}",
                  "game-sim:huggingface_hub:logout", "game-sim:_pytest.config:main",
                  "game-sim:numpy.f2py.__main__:main", f"game-sim:{SHORT}"]


@pytest.mark.parametrize("model", HOSTILE_MODELS)
@pytest.mark.parametrize("command", ["record", "generate"])
def test_a_log_naming_an_importable_factory_imports_nothing_exit_2(model, command, tmp_path,
                                                                   capsys, monkeypatch):
    try:
        import huggingface_hub
    except ImportError:
        pass
    else:
        monkeypatch.setattr(huggingface_hub, "logout",
                            lambda *a, **k: pytest.fail("huggingface_hub.logout called"))
    before = set(sys.modules)
    path = tmp_path / "shared.log.json"
    path.write_text(json.dumps(_log(model)))
    argv = (["record", "--from-log", str(path), "--out", str(tmp_path / "data")]
            if command == "record" else
            ["generate", "--replay", str(path), "--out", str(tmp_path / "x.mp4")])
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err, err
    assert "never imports code" in err or "learned world" in err, err  # record: the game's
    assert not {"tests.fixtures.tripwire", "numpy.f2py.__main__"} & set(sys.modules)
    assert not getattr(sys, "worldstream_tripwire", False)
    assert not (tmp_path / "data").exists() and not (tmp_path / "x.mp4").exists()
    assert "tests.fixtures.games" in before or "tests.fixtures.games" not in sys.modules


def test_a_log_of_a_factory_game_plays_when_the_command_line_names_it(tmp_path, capsys):
    """The user's own ``--env MODULE:FACTORY``: the log's model compared as a string."""
    from tests.studio.test_replay import record_session
    from worldstream.engine.core.api import ActionCommand

    config = EngineConfig(max_sessions=1, fps=60, chunk_frames=2)
    with Engine(GameEnvBackend(env=SHORT), config) as engine:
        _, log = record_session(engine, "play", 1,
                                [(2, ActionCommand(1, 0.0, frozenset({"right"})))], 8)
    path = tmp_path / "mine.log.json"
    path.write_text(json.dumps(log))
    out = tmp_path / "data"
    assert main(["record", "--from-log", str(path), "--out", str(out)]) == 2
    assert main(["record", "--from-log", str(path), "--env", "ALE/Pong-v5", "--out",
                 str(out)]) == 2
    assert "not 'game-sim:ALE/Pong-v5'" in capsys.readouterr().err
    assert main(["record", "--from-log", str(path), "--env", SHORT, "--out", str(out)]) == 0
    assert main(["generate", "--replay", str(path), "--env", SHORT, "--out",
                 str(tmp_path / "x.mp4")]) == 0


@given(st.one_of(
    st.text(max_size=60),
    st.builds("{}:{}".format, st.sampled_from(["game-sim", "game-builtin", "sim", "x", ""]),
              st.one_of(st.text(max_size=30), st.sampled_from(
                  [TRIPWIRE, "os:fork", "ALE/Pong-v5", "a.b:c", "ALE/x:y", "gym:CartPole-v1",
                   "numpy.f2py.__main__:main", "mod:Env-v0", ""]))),
    values))
@settings(FUZZ, max_examples=300)
def test_any_model_a_file_names_is_a_string_compared_never_imported(model):
    """Accepted: a model with no module path in it (or the one the command line named)."""
    try:
        got = registry.model_of_file(model, None, "log")
    except ValueError as err:
        one_line(err)
    else:
        env = registry.env_of(got)
        assert env is None or ":" not in env
    named = "game-sim:tests.fixtures.games:make_short_game"
    try:
        assert registry.model_of_file(model, named, "log") == named
    except ValueError as err:
        one_line(err)
        assert model != named


@pytest.mark.parametrize("env_id, message", [
    ("numpy.f2py.__main__:main", "__main__"), ("_pytest.config:main", "_pytest"),
    ("tests.fixtures._hidden:make", "_hidden"), ("tests.fixtures.games:_private", "_private"),
    ("tests.fixtures.games:__class__", "__class__")])
def test_env_ids_of_main_or_private_modules_are_refused_unimported(env_id, message):
    """``play --env numpy.f2py.__main__:main`` ran f2py's command line on import."""
    before = set(sys.modules)
    with pytest.raises(GameEnvError, match=message) as err:
        GameEnv(env_id, size=16)
    one_line(err.value)
    assert "numpy.f2py.__main__" not in set(sys.modules) - before


# ---------------------------------------------------------------- save points per family
def _saved(backend, state, session: dict | None = None) -> tuple[dict, dict]:
    arrays, scalars = export_state(backend, state)
    keys: list[str] = []
    meta = {"format": savepoint.SAVEPOINT_FORMAT, "model": backend.name,
            "model_version": savepoint.model_version(backend),
            "session": {"seed": 9, "prompt": "play", "action": backend.key_action(frozenset()),
                        "frame_index": 10, "chunk_frames": 2, "steps": 1, "mode": None,
                        "fork_id": -1, "keys": keys, "pointer": [0.0, 0.0], **(session or {})},
            "state": scalars}
    return arrays, meta


def _edited(meta: dict, path: tuple, value) -> dict:
    meta = json.loads(json.dumps(meta))
    parent = meta
    for key in path[:-1]:
        parent = parent[key]
    if value is _DROP:
        parent.pop(path[-1])
    else:
        parent[path[-1]] = value
    return meta


_DROP = object()
#: fields of the engine's part of any save file: out of range, of another type, unknown
SESSION_EDITS = [
    (("session", "action"), 65535), (("session", "action"), 2**40), (("session", "seed"), 10**100),
    (("session", "seed"), -1), (("session", "fork_id"), 10**30),
    (("session", "frame_index"), 10**30), (("session", "pointer"), [math.nan, 0.0]),
    (("session", "pointer"), [0.0, math.inf]), (("session", "pointer"), [1e308, 0.0]),
    (("session", "keys"), ["nosuchkey"]), (("session", "keys"), ["x" * 300]),
    (("session", "keys"), [1]), (("session", "steps"), 10**9), (("session", "mode"), "fast"),
    (("session", "extra"), 1), (("extra",), {"a": 1}), (("session", "prompt"), ""),
    (("session", "chunk_frames"), 0),
]


def _refused(backend, arrays: dict, meta: dict) -> SavepointError:
    with pytest.raises(SavepointError) as err:
        got_arrays, got_meta = savepoint.decode(savepoint.encode(arrays, meta), backend)
        state = import_state(backend, got_arrays, got_meta["state"])
        backend.free(state)
    one_line(err.value)
    return err.value


@pytest.fixture(scope="module")
def pong():
    backend = GameEnvBackend(env=PONG, rewind_chunks=3)
    state = backend.new_state("play", 9)
    for action in (1, 1, 2, 3, 1):
        backend.generate([ChunkJob(state, [action] * 2, 2)])
    arrays, meta = _saved(backend, state)
    backend.free(state)
    yield backend, arrays, meta
    backend.close()


#: Pong's state: fields and arrays a game cannot have
GAME_EDITS = [
    (("state", "seed"), 10**100), (("state", "extra"), 1), (("state", "now", "seed"), 2**40),
    (("state", "now", "episode"), 10**30), (("state", "now", "done"), 1),
    (("state", "now", "extra"), 0), (("state", "history"), [{}] * 9),
    (("state", "now"), _DROP),
]


def test_a_pong_save_point_with_fields_the_game_cannot_have_is_refused(pong):
    """The issue's ``session.action = 65535`` loaded, then the session died at its next
    chunk; unknown keys, NaN pointers, ``seed = 10**100``, ``fork_id = 10**30`` loaded."""
    backend, arrays, meta = pong
    for path, value in [*SESSION_EDITS, *GAME_EDITS, (("session", "action"), 6),
                        (("session", "keys"), ["fire"])]:  # fire is action 1, not 0
        _refused(backend, arrays, _edited(meta, path, value))
    for name, array in [("now.other", np.zeros(1, np.uint8)),
                        ("now.actions", np.zeros((2, 2), np.int32)),
                        ("now.actions", np.zeros(3, np.float32)),
                        ("now.native", np.zeros(2**21, np.uint8)),
                        ("now.frame", np.zeros((64, 64, 3), np.int32))]:
        _refused(backend, {**arrays, name: array}, meta)
    got = _refused(backend, {k: v for k, v in arrays.items() if k != "history.0.native"},
                   meta)
    assert "emulator state" in str(got)


def test_an_honest_save_point_of_each_game_family_still_loads(pong):
    backend, arrays, meta = pong
    held = _edited(_edited(meta, ("session", "keys"), ["fire"]), ("session", "action"),
                   backend.key_action(frozenset({"fire"})))
    for m in (meta, held, _edited(meta, ("session", "keys"), _DROP)):
        got_arrays, got_meta = savepoint.decode(savepoint.encode(arrays, m), backend)
        backend.free(import_state(backend, got_arrays, got_meta["state"]))


def test_the_simulators_save_point_is_checked_field_by_field():
    backend = SimBackend()
    state = backend.new_state("a green meadow", 3)
    backend.generate([ChunkJob(state, [2] * backend.chunk_frames, 1)])
    arrays, meta = _saved(backend, state, {"prompt": "a green meadow",
                                           "chunk_frames": backend.chunk_frames})
    backend.free(state)
    got_arrays, got_meta = savepoint.decode(savepoint.encode(arrays, meta), backend)
    backend.free(import_state(backend, got_arrays, got_meta["state"]))
    for path, value in [*SESSION_EDITS, (("state", "sim", "pos"), [math.nan, 0.0]),
                        (("state", "sim", "pos"), [1e300, 0.0]),
                        (("state", "sim", "t"), 10**100), (("state", "sim", "seed"), -3),
                        (("state", "sim", "scene"), "moon"), (("state", "sim", "x"), 1),
                        (("state", "sim", "facing"), [5, 0]), (("state", "extra"), []),
                        (("state", "history"), [meta["state"]["sim"]] * 99)]:
        _refused(backend, arrays, _edited(meta, path, value))
    _refused(backend, {"x": np.zeros(4, np.uint8)}, meta)


@given(st.sampled_from(["seed", "scene", "_prev_scene", "_transition", "pos", "vel",
                        "facing", "t", "_transition_len", "new"]),
       st.one_of(values, st.floats(), st.integers()))
@settings(FUZZ, max_examples=60)
def test_any_edited_simulator_field_loads_and_plays_or_is_one_line_savepoint_error(field,
                                                                                    value):
    backend = _SIM
    arrays, meta = _SIM_SAVE
    edited = _edited(meta, ("state", "sim", field), value)
    try:
        got_arrays, got_meta = savepoint.decode(savepoint.encode(arrays, edited), backend)
        state = import_state(backend, got_arrays, got_meta["state"])
    except SavepointError as err:
        one_line(err)
        return
    try:
        (result,) = backend.generate([ChunkJob(state, [1] * backend.chunk_frames, 1)])
        assert result.error is None and np.isfinite(result.frames).all()
    finally:
        backend.free(state)


def _sim_save():
    backend = SimBackend()
    state = backend.new_state("a snowy forest", 5)
    saved = _saved(backend, state, {"prompt": "a snowy forest",
                                    "chunk_frames": backend.chunk_frames})
    backend.free(state)
    return backend, saved


_SIM, _SIM_SAVE = _sim_save()


def test_the_learned_builtins_save_point_session_is_checked():
    """The learned built-in (a tiny random one): the engine's fields of its file."""
    from tests.fixtures.builtin import tiny_generator

    backend = tiny_generator()
    state = backend.new_state("a green meadow", 1)
    arrays, meta = _saved(backend, state, {"prompt": "a green meadow",
                                           "chunk_frames": backend.chunk_frames})
    backend.free(state)
    got_arrays, got_meta = savepoint.decode(savepoint.encode(arrays, meta), backend)
    backend.free(import_state(backend, got_arrays, got_meta["state"]))
    for path, value in SESSION_EDITS:
        _refused(backend, arrays, _edited(meta, path, value))


def test_the_learned_game_worlds_save_point_is_checked():
    from tests.fixtures.game_world import tiny_world_folder
    from tests.fixtures.tiny_game import TINY
    from worldstream.engine.backends.game.world import GameWorldBackend

    backend = GameWorldBackend(env=TINY, path=tiny_world_folder(), rewind_chunks=2)
    state = backend.new_state("play", 2)
    backend.generate([ChunkJob(state, [1, 1], 2)])
    arrays, meta = _saved(backend, state)
    backend.free(state)
    got_arrays, got_meta = savepoint.decode(savepoint.encode(arrays, meta), backend)
    backend.free(import_state(backend, got_arrays, got_meta["state"]))
    for path, value in [*SESSION_EDITS, (("state", "seed"), 10**100),
                        (("state", "extra"), 1), (("state", "history"), 5),
                        (("session", "action"), backend.num_actions)]:
        _refused(backend, arrays, _edited(meta, path, value))
    for name, array in [("now.other", np.zeros(1, np.uint8)),
                        ("now.step", np.array([-1], np.int64)),
                        ("now.step", np.array([2**63 + 5], np.uint64)),
                        ("now.actions", np.zeros(10**5, np.int32))]:
        _refused(backend, {**arrays, name: array}, meta)
    backend.close()


# ---------------------------------------------------------------- over HTTP (Pong)
@pytest.fixture(scope="module")
def pong_app(tmp_path_factory):
    backend = GameEnvBackend(env=PONG, rewind_chunks=3)
    limits = Limits(max_sessions=4, messages_per_s=1e9, message_burst=10**9,
                    auth_failure_burst=10**9, creation_burst=10**9)
    with Engine(backend, EngineConfig(max_sessions=4, fps=30, chunk_frames=2)) as engine:
        app = create_app(engine, limits, ui=False,
                         recording_dir=tmp_path_factory.mktemp("rec"))
        with TestClient(app, raise_server_exceptions=False) as client:
            s = create(client)
            saved = client.get(f"/api/sessions/{s['session_id']}/state", headers=auth(s))
            assert saved.status_code == 200, saved.text
            arrays, meta = savepoint.decode(saved.content, backend)
            meta["session"] = meta["session"].model_dump()
            yield client, s, arrays, meta


def test_bad_pong_save_points_over_http_are_400_and_change_nothing(pong_app):
    client, s, arrays, meta = pong_app
    url, headers = f"/api/sessions/{s['session_id']}/state", {
        **auth(s), "Content-Type": "application/octet-stream"}
    edits = [(meta, p, v) for p, v in [*SESSION_EDITS, *GAME_EDITS]]
    for _, path, value in edits:
        r = client.post(url, content=savepoint.encode(arrays, _edited(meta, path, value)),
                        headers=headers)
        assert r.status_code == 400, (path, value, r.status_code, r.text[:200])
        one_line(r.json()["message"] if "message" in r.json() else r.text)
    log = client.get(f"/api/sessions/{s['session_id']}/log", headers=auth(s))
    assert log.json()["start"] == {"kind": "prompt"}  # no load took place
    r = client.post(url, content=savepoint.encode(arrays, meta), headers=headers)
    assert r.status_code == 200, r.text


# ---------------------------------------------------------------- sizes
def test_more_actions_than_an_episode_is_refused_from_the_header(pong, monkeypatch):
    """A 16 MB ``now.actions`` took the server from 375 to 987 MB (16 rewind snapshots of
    it) and its next save was 272 MB: refused before any array is decoded."""
    backend, arrays, meta = pong
    monkeypatch.setattr(savepoint, "_arrays",
                        lambda *a: pytest.fail("arrays decoded before the checks"))
    big = {**arrays, "now.actions": np.ones(4 * 2**20, np.int32)}
    raw = savepoint.encode(big, meta)
    with pytest.raises(SavepointError, match="at most 27000 actions") as err:
        savepoint.decode(raw, backend)
    one_line(err.value)


def test_the_longest_honest_episode_loads_and_its_next_save_loads(pong):
    backend, arrays, meta = pong
    longest = {**arrays, "now.actions": np.ones(backend.max_episode_actions, np.int32),
               **{f"history.{i}.actions": np.ones(backend.max_episode_actions - 2, np.int32)
                  for i in range(3)}}
    got_arrays, got_meta = savepoint.decode(savepoint.encode(longest, meta), backend)
    state = import_state(backend, got_arrays, got_meta["state"])
    try:
        backend.generate([ChunkJob(state, [1, 1], 2)])  # a snapshot pushed: still bounded
        again = savepoint.encode(*_saved(backend, state))
    finally:
        backend.free(state)
    assert len(again) < MAX_SAVEPOINT_BYTES // 16
    got_arrays, got_meta = savepoint.decode(again, backend)
    backend.free(import_state(backend, got_arrays, got_meta["state"]))


def test_a_request_body_is_held_once():
    """The body was read as a list of chunks joined at the end: held twice while it was
    read (with the decoded copies of its arrays, a load's transient was over the goal of 2x
    the file). One buffer, grown as the chunks arrive."""
    import asyncio
    import tracemalloc

    from worldstream.app.world_routes import _read_capped

    class Request:
        headers: dict = {}

        async def stream(self):
            for _ in range(64):
                yield bytes(2**16)  # a fresh chunk, as the server receives them

    async def read() -> tuple[int, int]:
        # NOTE: measured inside the loop: asyncio.run's shutdown may format its result
        tracemalloc.start()
        try:
            body = await _read_capped(Request(), 2**30, RuntimeError)
            return len(body) * (not any(body)), tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    size, peak = asyncio.run(read())
    assert size == 2**22
    assert peak < 1.5 * size, peak  # the chunks and their join: 2x


def test_a_save_files_arrays_are_views_of_its_bytes_and_the_state_keeps_none(pong):
    """``safetensors.numpy.load`` copied every array: the file was held once more while it
    loaded. The arrays are read-only views of the body; the state copies what it keeps (an
    episode's actions saved in the game's own compact dtype, once kept as such, held the
    whole body for the state's life)."""
    from worldstream.engine.worlds.game.env import action_dtype

    backend, arrays, meta = pong
    compact = {k: v.astype(action_dtype(backend.num_actions)) if k.endswith(".actions") else v
               for k, v in arrays.items()}
    body = bytearray(savepoint.encode(compact, meta))  # as the server reads it
    whole = np.frombuffer(body, np.uint8)
    got, got_meta = savepoint.decode(body, backend)
    assert got.keys() == arrays.keys()
    for name, array in got.items():
        assert np.array_equal(array, compact[name]) and array.dtype == compact[name].dtype
        assert not array.flags.writeable and (np.shares_memory(array, whole) or not array.size)
    state = import_state(backend, got, got_meta["state"])
    try:
        snaps = [state.game.snapshot(), *(snap for snap, _ in state.history)]
        assert len(snaps) == 4
        for snap in snaps:
            assert not np.shares_memory(snap.actions, whole)
            assert not np.shares_memory(snap.frame, whole)
    finally:
        backend.free(state)


@pytest.mark.parametrize("edit, message", [
    (lambda h: h["now.frame"].update(data_offsets=[o + 1 for o in
                                                   h["now.frame"]["data_offsets"]]),
     "overlaps another or leaves a gap|cut short"),
    (lambda h: h["now.frame"].update(shape=[2**62, 2**62, 0, 3]), "is malformed"),
    (lambda h: h["now.frame"].update(dtype="BF16"), "is malformed"),
    (lambda h: h["now.frame"].update(data_offsets=[-1, 10]), "is malformed"),
])
def test_a_header_that_does_not_describe_its_bytes_is_refused(pong, edit, message):
    """The arrays are views of the file's bytes: their offsets, sizes and dtypes are checked
    against the header and the file before any is made."""
    backend, arrays, meta = pong
    raw = savepoint.encode(arrays, meta)
    size = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + size])
    edit(header)
    text = json.dumps(header).encode()
    with pytest.raises(SavepointError, match=message) as err:
        savepoint.decode(len(text).to_bytes(8, "little") + text + raw[8 + size:], backend)
    one_line(err.value)
    with pytest.raises(SavepointError, match="damaged or cut short") as err:
        savepoint.decode(raw + b"\0", backend)
    with pytest.raises(SavepointError, match="damaged or cut short") as err:
        savepoint.decode(raw[:-1], backend)


# ---------------------------------------------------------------- a load that replays
@pytest.fixture()
def copied():
    backend = GameEnvBackend(env=COPIED, size=16, rewind_chunks=4)
    state = backend.new_state("play", 4)
    for action in (2, 2, 1, 0, 2, 1):
        backend.generate([ChunkJob(state, [action] * 3, 1)])
    arrays, meta = _saved(backend, state, {"chunk_frames": 3})
    backend.free(state)
    yield backend, arrays, meta
    backend.close()


def test_a_save_without_emulator_state_replays_off_the_engine_thread(copied):
    """A crafter save replayed its actions on the engine thread: every session froze for
    18-45 s. Then in the caller's thread, where its pure-Python steps held the GIL (other
    sessions' frames stalled). The replay runs in a child process; the engine thread
    only adopts the state, and a rewind restores the env's own copies (no replay either)."""
    backend, arrays, meta = copied
    got_arrays, got_meta = savepoint.decode(savepoint.encode(arrays, meta), backend)
    CopiedGame.steps.clear()
    make = prepare_import(backend, got_arrays, got_meta["state"])
    assert CopiedGame.steps == []  # no step of the replay in this process
    # the snapshots came back with the env's copies, one episode's actions one array
    snaps = [make.state.game.snapshot(), *(snap for snap, _ in make.state.history)]
    assert all(isinstance(snap.native, type(make.state.game.env.unwrapped)) for snap in snaps)
    assert all(np.shares_memory(snaps[1].actions, snap.actions) for snap in snaps[2:])
    adopted = []
    worker = threading.Thread(target=lambda: adopted.append(make()))  # "the engine thread"
    worker.start()
    worker.join()
    (state,) = adopted
    while state.history:
        backend.rewind(state, 1)
    assert CopiedGame.steps == []
    (result,) = backend.generate([ChunkJob(state, [1], 1)])
    assert result.error is None
    backend.free(state)


def test_a_save_whose_replay_is_too_long_or_wrong_is_refused(copied, monkeypatch):
    backend, arrays, meta = copied
    raw = savepoint.encode(arrays, meta)
    monkeypatch.setattr(savestate_game, "MAX_REPLAY_STEPS", 10)
    with pytest.raises(SavepointError, match="replay 18 steps; the limit is 10") as err:
        got_arrays, got_meta = savepoint.decode(raw, backend)
        prepare_import(backend, got_arrays, got_meta["state"])
    one_line(err.value)
    monkeypatch.undo()
    edited = {**arrays, "now.actions": np.zeros_like(arrays["now.actions"])}
    _refused(backend, edited, meta)  # actions that do not replay to the saved frame


def test_an_unadopted_state_made_off_the_engine_thread_is_freed(copied):
    backend, arrays, meta = copied
    got_arrays, got_meta = savepoint.decode(savepoint.encode(arrays, meta), backend)
    make = prepare_import(backend, got_arrays, got_meta["state"])
    state = make.state
    del make
    assert state.freed


# ---------------------------------------------------------------- a long record --from-log
def test_record_from_log_writes_shards_as_it_plays(tmp_path, monkeypatch):
    """A 309-byte log grew the process 9 MB/s: every frame was held until the end."""
    backend = GameEnvBackend(env=SHORT, size=16)
    log = dict(_log(backend.name), model_version=savepoint.model_version(backend),
               chunks=300, frames=300)
    held: list[int] = []
    add = game_log._Shards.add

    def watched(self, *args, **kwargs):
        add(self, *args, **kwargs)
        held.append(len(self._frames))

    monkeypatch.setattr(game_log._Shards, "add", watched)
    meta = game_log.dataset_from_log(json.dumps(log).encode(), tmp_path / "data",
                                     shard_frames=20, backend=backend)
    assert max(held) <= 20
    # 300 frames in 25 episodes of 12 steps (+1 reset frame each), one segment: 325 frames
    # minus... the count the dataset reads back
    from worldstream.engine.worlds.game import dataset

    _, episodes = dataset.load(tmp_path / "data", env_id=SHORT)
    assert meta["frames"] == len(episodes) and meta["shards"] == len(
        list(Path(tmp_path / "data").glob("shard-*.npz")))
    assert meta["shards"] >= 300 // 20
