"""Fuzzing a game world's inputs (issue 57's last item: the surfaces issue 54 added), with the
strategies and settings of ``test_fuzz``: ``action`` messages holding any key list against a
game's wire keys, key-map JSON, env ids (``module:factory`` ones import code: no module of
Python's own is imported, no function but a factory its module defines is called), recorded
dataset shards and meta, save points
of a game and input logs with game keys. Each input is accepted and then behaves, or is refused
with the one documented exception (MessageError, KeyMapError, GameEnvError, DatasetError,
SavepointError, ValueError) and a one-line message; nothing else changes.

Case counts (``max_examples``): actions 120 + key maps 250 + key-map files 80 + env ids 200
+ hostile ids 26 + dataset folders 150 + save points 150 (direct) and 20 (HTTP) + input logs
60 + log texts 150 = 1,206 per run (~7 s on 2 cores); the inputs that failed are kept as
tests of their own. A game session's teardown races are ``test_teardown_races``'s.
"""

from __future__ import annotations

import asyncio
import io
import itertools
import json
import re
import sys
import tempfile
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.app.test_fuzz import FUZZ, _Recorder, values
from tests.fixtures.games import EXITS, NOT_AN_ENV, SHORT
from tests.fixtures.server import auth, create
from worldstream.app.server import create_app
from worldstream.engine.backends.game.log_dataset import dataset_from_log
from worldstream.engine.backends.game.sim import GameEnvBackend
from worldstream.engine.core.backend import ChunkJob
from worldstream.engine.core.config import EngineConfig
from worldstream.engine.core.engine import Engine
from worldstream.engine.core.limits import WIRE_KEY_PATTERN
from worldstream.engine.core.registry import load_backend
from worldstream.engine.studio import savepoint
from worldstream.engine.studio.replay import read_log
from worldstream.engine.studio.savepoint import SavepointError
from worldstream.engine.studio.savestate import export_state, import_state
from worldstream.engine.worlds.game import dataset, keymap
from worldstream.engine.worlds.game import env as game_env
from worldstream.engine.worlds.game.env import GameEnv, GameEnvError
from worldstream.streaming import messages as m
from worldstream.streaming.control import ControlChannel
from worldstream.streaming.limits import Limits
from worldstream.streaming.sessions import SessionManager

BREAKOUT = "ALE/Breakout-v5"
MEANINGS = ("NOOP", "FIRE", "RIGHT", "LEFT")  # Breakout's
WIRE = re.compile(WIRE_KEY_PATTERN)


def one_line(err: BaseException) -> None:
    assert str(err) and "\n" not in str(err), repr(str(err))[:300]


# ---------------------------------------------------------------- action messages
#: key names a page, a script or an attacker might send: near misses of the game's keys
#: (case, spaces, a trailing newline, NUL, look-alike letters), combos, the other worlds' keys
ODD_KEYS = ["fire", "left", "right", "up", "down", "FIRE", "Fire", " fire", "fire ", "fire\n",
            "fire\x00", "\ufb01re", "f\u0456re", "left+right", "fire+left", "+", "", "*",
            "noop", "NOOP", "fire" * 9, "\ud800", "a" * 32, "a" * 33]
held = st.one_of(st.sampled_from(ODD_KEYS), st.text(max_size=40),
                 st.integers(1, 5000).map(lambda n: "f" * n), values)
key_lists = st.one_of(st.lists(held, max_size=7), st.lists(st.sampled_from(ODD_KEYS[:5]),
                                                           max_size=5), values)
pointers = st.sampled_from([None, [0, 0], [1e308, -1e308], "x", [1]])
_seq = itertools.count(1)


@pytest.fixture(scope="module")
def breakout_engine():
    backend = GameEnvBackend(env=BREAKOUT, rewind_chunks=3)
    with Engine(backend, EngineConfig(max_sessions=4, fps=30, chunk_frames=2)) as engine:
        yield engine


@pytest.fixture(scope="module")
def game_channel(breakout_engine, tmp_path_factory):
    limits = Limits(max_sessions=4, messages_per_s=1e9, message_burst=10**9)
    manager = SessionManager(breakout_engine, limits, tmp_path_factory.mktemp("rec"))
    session = manager.create("ignored: a game has no prompt", seed=1)
    yield breakout_engine, manager, session
    manager.close_all()


@given(st.lists(st.tuples(key_lists, st.booleans(), pointers), min_size=1, max_size=6))
@settings(FUZZ, max_examples=120)
def test_game_actions_hold_the_keys_sent_or_change_nothing(game_channel, messages):
    """Any key list against Breakout's wire keys (fire, left, right): a list of distinct wire
    keys (at most 4) is held as the key map's action, anything else is refused with one
    MessageError naming ``keys`` (or the message's size) and leaves the held action as it was."""
    engine, manager, session = game_channel
    backend, sid = engine.backend, session.session_id
    held_now = engine.call(sid, lambda s: (s.action, s.action_seq)).result(timeout=30)
    raws, refused = [], 0
    for keys, ascii_only, pointer in messages:
        message = {"type": "action", "seq": next(_seq), "t": 0, "keys": keys}
        if pointer is not None:
            message["pointer"] = pointer
        raw = json.dumps(message, ensure_ascii=ascii_only, allow_nan=True)
        raws.append(raw)
        try:
            parsed = m.parse_client_message(raw, backend.wire_keys)
        except m.MessageError as err:
            refused += 1
            assert err.code and err.reason and "\n" not in err.reason
            assert err.field.split(".")[0] in ("keys", "pointer", "message"), err.field
            continue
        assert set(parsed.keys) <= set(backend.wire_keys)
        assert len(set(parsed.keys)) == len(parsed.keys) <= 4
        held_now = (backend.key_action(frozenset(parsed.keys)), parsed.seq)
    out = _Recorder()
    control = ControlChannel(manager, session, out)

    async def feed():
        for raw in raws:
            await control.handle_text(raw)

    asyncio.run(feed())
    errors = [r for r in out.sent if r["type"] == "error"]
    assert len(errors) == refused, out.sent
    # the engine applied exactly the accepted ones (commands and calls share one queue)
    assert engine.call(sid, lambda s: (s.action, s.action_seq)).result(timeout=30) == held_now


# ---------------------------------------------------------------- key maps
codes = st.one_of(st.sampled_from(["Space", "ArrowLeft", "KeyA", "Digit1", "Space\n", "",
                                   "A" * 25, "Key A", "ArrowLeft\x00", "\u0410rrowLeft"]),
                  st.text(max_size=30))
wires = st.one_of(st.sampled_from(["fire", "left", "right", "up", "fire\n", "Fire", "a" * 33,
                                   "", "x+y", "fire_2", "\n"]), st.text(max_size=34), values)
combos = st.one_of(st.sampled_from(["", "fire", "left+fire", "fire+left", "+", "fire++left",
                                    "fire\n", "left+right+fire", "x", "fire+\n"]),
                   st.text(max_size=20))
meanings = st.one_of(st.sampled_from([*MEANINGS, "JUMP", "noop", ""]), st.integers(-5, 10),
                     st.integers(-(2**70), 2**70), st.booleans(), values)
keymap_json = st.one_of(values, st.fixed_dictionaries(
    {"keys": st.one_of(st.dictionaries(codes, wires, max_size=6), values),
     "actions": st.one_of(st.dictionaries(combos, meanings, max_size=6), values)},
    optional={"env": st.one_of(st.just(BREAKOUT), values), "extra": values}))


def check_keymap(km: keymap.KeyMap) -> None:
    """What the page, the wire and the engine rely on in an accepted key map."""
    assert km.wire_keys and all(WIRE.fullmatch(w) for w in km.wire_keys), km.wire_keys
    assert all(re.fullmatch(r"[A-Za-z0-9]{1,24}", c) for c in km.keys)
    assert km.wire_keys <= set(km.keys.values())
    assert all(0 <= a < len(MEANINGS) for a in km.actions.values())
    wire = sorted(km.wire_keys)
    for held_keys in itertools.chain.from_iterable(
            itertools.combinations(wire, n) for n in range(min(len(wire), 4) + 1)):
        assert 0 <= km.action(frozenset(held_keys)) < len(MEANINGS)
    again = keymap.from_json(json.loads(json.dumps(km.to_json())), MEANINGS, BREAKOUT)
    assert (again.keys, again.actions) == (km.keys, km.actions)


@given(keymap_json)
@settings(FUZZ, max_examples=250)
def test_any_key_map_json_fits_its_env_or_is_one_line_key_map_error(data):
    try:
        km = keymap.from_json(data, MEANINGS, BREAKOUT)
    except keymap.KeyMapError as err:
        one_line(err)
        return
    check_keymap(km)


def test_a_wire_key_with_a_trailing_newline_is_refused():
    """``$`` matched before a final newline: ``"fire\\n"`` was a wire key (and a log's key)."""
    with pytest.raises(keymap.KeyMapError, match="wire key name"):
        keymap.from_json({"keys": {"Space": "fire\n"}, "actions": {"fire": "FIRE"}}, MEANINGS,
                         BREAKOUT)
    with pytest.raises(keymap.KeyMapError, match="KeyboardEvent.code"):
        keymap.from_json({"keys": {"Space\n": "fire"}, "actions": {"fire": "FIRE"}}, MEANINGS,
                         BREAKOUT)
    with pytest.raises(keymap.KeyMapError, match=r"wire keys are \[a-z0-9_\]"):
        keymap.from_json({"keys": {"Space": "fire"}, "actions": {"fire\n": "FIRE"}}, MEANINGS,
                         BREAKOUT)
    with pytest.raises(m.MessageError, match="keys.0"):
        m.parse_client_message('{"type":"action","seq":1,"t":0,"keys":["fire\\n"]}', ("fire",))
    # no keys at all: the wire would have taken the direction keys in their place
    with pytest.raises(keymap.KeyMapError, match="no keys"):
        keymap.from_json({"keys": {}, "actions": {"": "NOOP"}}, MEANINGS, BREAKOUT)


@pytest.mark.parametrize("raw", [b"\xff\xfe{}", b"[" * 100_000])
def test_a_key_map_file_not_utf8_or_nested_deep_is_key_map_error(raw, tmp_path):
    """UnicodeDecodeError and RecursionError came out of ``keymap.load``."""
    (tmp_path / "keys.json").write_bytes(raw)
    with pytest.raises(keymap.KeyMapError, match="cannot read key map") as err:
        keymap.load(tmp_path / "keys.json", MEANINGS, BREAKOUT)
    one_line(err.value)


@given(st.one_of(keymap_json.map(lambda d: json.dumps(d, allow_nan=True).encode()),
                 st.binary(max_size=200), st.sampled_from([b"\xff\xfe{}", b"[" * 100_000,
                                                           b'{"keys":' * 5000, b""])))
@settings(FUZZ, max_examples=80)
def test_any_key_map_file_is_read_or_refused_with_key_map_error(raw):
    """Not UTF-8 and nesting bombs raised UnicodeDecodeError and RecursionError."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "keys.json"
        path.write_bytes(raw)
        try:
            km = keymap.load(path, MEANINGS, BREAKOUT)
        except keymap.KeyMapError as err:
            one_line(err)
            return
    check_keymap(km)


# ---------------------------------------------------------------- env ids
class _NoImports:
    """Stands in for ``importlib`` in ``engine.worlds.game.env`` while env ids are fuzzed: a
    random ``module:factory`` id imports nothing (it records what it would have imported)."""

    def __init__(self):
        self.asked: list[str] = []

    def import_module(self, name: str):
        self.asked.append(name)
        raise ModuleNotFoundError(f"No module named {name!r} (the fuzz suite imports nothing)")


def _stdlib(module: str) -> bool:
    top = module.split(".")[0]
    return top in sys.stdlib_module_names or top in sys.builtin_module_names


env_ids = st.one_of(
    st.text(max_size=60),
    st.from_regex(r"[A-Za-z_][A-Za-z0-9_.]{0,20}:[A-Za-z_][A-Za-z0-9_]{0,12}", fullmatch=True),
    st.tuples(st.text(max_size=12), st.text(max_size=12)).map(":".join),
    st.builds(lambda a, b: f"ALE/{a}-v{b}", st.text(max_size=10), st.integers(0, 9)),
    st.sampled_from(["", " ", ":", "::", "a:b:c", "ALE/", "ALE/Breakout-v5\n", "x\ny",
                     "ALE/Breakout-v5 ", "CartPole-v1", "FrozenLake-v1", "Blackjack-v1",
                     "os:fork", "sys:exit", "builtins:input", "antigravity:x", "\x00:y",
                     ".games:make", "tests..fixtures:x", "gymnasium:make", "Vizdoom:x"]),
    st.integers(1000, 100_000).map(lambda n: "A" * n),
)


@given(env_ids)
@settings(FUZZ, max_examples=200)
def test_any_env_id_is_a_game_or_one_line_game_env_error(env_id):
    stub = _NoImports()
    with mock.patch.object(game_env, "importlib", stub):
        try:
            game = GameEnv(env_id, size=16)
        except GameEnvError as err:
            one_line(err)
        else:
            assert game.num_actions >= 1 and len(game.action_meanings) == game.num_actions
            game.close()
    for name in stub.asked:  # only dotted names outside Python's own modules reach an import
        assert all(part.isidentifier() for part in name.split(".")) and not _stdlib(name), name


#: ids an input log (or a world folder) could name: Python's own modules, a third-party
#: package's re-exported function (pytest.main is _pytest's), malformed module paths,
#: factories that are not envs or exit the process
HOSTILE_IDS = ["os:fork", "os:abort", "posix:fork", "sys:exit", "builtins:input",
               "builtins:breakpoint", "_thread:interrupt_main", "signal:pause",
               "antigravity:x", "this:x", "subprocess:Popen", "pdb:set_trace", "code:interact",
               "shutil:rmtree", "pytest:main", "pytest:exit", ".games:make_short_game",
               "tests..fixtures.games:make_short_game", ":make_short_game",
               "tests.fixtures.games:", "tests.fixtures.games:make_short_game()",
               "tests.fixtures.games:ShortGame.reset", "tests.fixtures.games:np",
               "tests.fixtures.games:SHORT", EXITS, NOT_AN_ENV,
               "x\ny", "ALE/Breakout-v5\n"]  # gym's message held the id's newline


@pytest.mark.parametrize("env_id", HOSTILE_IDS)
def test_hostile_env_ids_import_and_call_nothing(env_id, monkeypatch):
    import builtins
    import os

    called: list[str] = []
    for owner, name in ((os, "fork"), (os, "abort"), (sys, "exit"), (builtins, "input"),
                        (builtins, "breakpoint"), (pytest, "main"), (pytest, "exit")):
        monkeypatch.setattr(owner, name, lambda *a, _n=name, **k: called.append(_n))
    before = set(sys.modules)
    with pytest.raises(GameEnvError) as err:
        GameEnv(env_id, size=16)
    one_line(err.value)
    assert not called
    assert not {"antigravity", "this", "code", "subprocess"} & (set(sys.modules) - before)
    # the way an id comes from a file: an input log names its model, and the CLI loads it
    with pytest.raises(GameEnvError):
        load_backend(f"game-sim:{env_id}")
    assert not called


# ---------------------------------------------------------------- recorded datasets
def _npz(**arrays) -> bytes:
    buf = io.BytesIO()
    np.savez_compressed(buf, **arrays)
    return buf.getvalue()


_rng = np.random.default_rng(0)
SHARD = {"frames": _rng.integers(0, 256, (6, 16, 16, 3), dtype=np.uint8),
         "actions": np.array([0, 1, 2, 1, 0, -1], np.int16),
         "episode": np.full(6, 7, np.int64)}
META = {"env": SHORT, "size": 16, "action_meanings": ["NOOP", "LEFT", "RIGHT"], "frames": 6,
        "shards": 1, "seed": 7, "policy": "held-key"}
dtypes = st.sampled_from(["uint8", "int8", "int16", "int64", "uint64", "float32", "float64",
                          "bool", "complex64", "U3", "object"])
shapes = st.one_of(st.sampled_from([(), (6,), (6, 16, 16), (6, 16, 16, 3), (6, 17, 16, 3),
                                    (0, 16, 16, 3), (5,), (6, 1), (1, 16, 16, 3, 1)]),
                   st.lists(st.integers(0, 7), max_size=4).map(tuple))
fills = st.sampled_from([0, 1, -1, 2, 3, 255, -2, 2**40, float("nan"), float("inf")])


@st.composite
def shard_bytes(draw) -> bytes:
    arrays = dict(SHARD)
    for _ in range(draw(st.integers(0, 3))):
        key = draw(st.sampled_from(["frames", "actions", "episode", "extra"]))
        if draw(st.booleans()):
            arrays.pop(key, None)
            continue
        shape, dtype, fill = draw(shapes), draw(dtypes), draw(fills)
        if dtype == "object":
            arrays[key] = np.full(shape, None, dtype=object)
        else:
            with np.errstate(all="ignore"):
                arrays[key] = np.full(shape, fill).astype(dtype)
    raw = _npz(**arrays)
    kind = draw(st.integers(0, 6))
    if kind == 1:  # cut anywhere
        raw = raw[:draw(st.integers(0, len(raw)))]
    elif kind == 2:  # bytes flipped in place
        data = bytearray(raw)
        for _ in range(draw(st.integers(1, 8))):
            data[draw(st.integers(0, len(data) - 1))] ^= draw(st.integers(1, 255))
        raw = bytes(data)
    elif kind == 3:  # something else entirely: garbage, a .npy file, a pickle
        buf = io.BytesIO()
        np.save(buf, SHARD["frames"])
        raw = draw(st.sampled_from([buf.getvalue(), b"", b"\x80\x04K\x01.", b"PK\x05\x06" +
                                    bytes(18)]) | st.binary(max_size=300))
    return raw


meta_json = st.one_of(
    st.fixed_dictionaries({}, optional={k: st.one_of(st.just(v), values)
                                        for k, v in META.items()}),
    values, st.just(META)).map(lambda d: json.dumps(d, allow_nan=True).encode())


@given(st.one_of(meta_json, st.binary(max_size=80), st.just(b"[" * 50_000)),
       st.lists(shard_bytes(), min_size=1, max_size=3), st.sampled_from([None, SHORT, "x"]),
       st.sampled_from([None, 1, 6, 100]))
@settings(FUZZ, max_examples=150)
def test_any_dataset_folder_loads_or_is_one_line_dataset_error(meta, shards, env_id, limit):
    """Truncated, flipped or foreign shard files, arrays of other shapes or dtypes, missing
    ones, meta of any JSON: raised TypeError (a .npy shard, 0-d frames, a list as size),
    zlib.error (a flipped byte), UnicodeDecodeError and RecursionError (meta.json), and let
    float actions (NaN) through."""
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        (root / "meta.json").write_bytes(meta)
        for i, raw in enumerate(shards):
            (root / f"shard-{i:05d}.npz").write_bytes(raw)
        try:
            got, episodes = dataset.load(root, env_id=env_id, max_frames=limit)
        except dataset.DatasetError as err:
            one_line(err)
            return
    size, n = got["size"], len(got["action_meanings"])
    assert episodes.frames.dtype == np.uint8 and episodes.frames.shape[1:] == (size, size, 3)
    assert np.issubdtype(episodes.actions.dtype, np.integer)
    assert episodes.actions.shape == (len(episodes),)
    if len(episodes):
        assert -1 <= episodes.actions.min() and episodes.actions.max() < n
    assert episodes.starts[0] == 0 and episodes.starts[-1] == len(episodes)
    assert len(episodes.seeds) == len(episodes.starts) - 1


def _bad_shard(kind: str) -> bytes:
    if kind == "npy":  # a .npy file named .npz: np.load gives an array
        buf = io.BytesIO()
        np.save(buf, SHARD["frames"])
        return buf.getvalue()
    if kind == "flipped":  # a byte of the deflated frames changed: zlib.error
        raw = bytearray(_npz(**SHARD))
        for i in range(100, 300):
            raw[i] ^= 0x55
        return bytes(raw)
    if kind == "0-d frames":
        return _npz(**dict(SHARD, frames=np.zeros((), np.uint8)))
    return _npz(**dict(SHARD, actions=np.array([0, 1, np.nan, 1, 0, -1])))  # float actions


@pytest.mark.parametrize("meta, shard", [
    (json.dumps(META).encode(), "npy"), (json.dumps(META).encode(), "flipped"),
    (json.dumps(META).encode(), "0-d frames"), (json.dumps(META).encode(), "float actions"),
    (json.dumps(dict(META, size=[16])).encode(), None), (b"\xff", None),
    (b"[" * 50_000, None), (json.dumps([META]).encode(), None)])
def test_dataset_failures_found_by_the_fuzz_are_dataset_errors(meta, shard, tmp_path):
    """TypeError (a .npy shard, 0-d frames, a list as size), zlib.error, UnicodeDecodeError,
    RecursionError, and NaN float actions let through."""
    (tmp_path / "meta.json").write_bytes(meta)
    (tmp_path / "shard-00000.npz").write_bytes(_npz(**SHARD) if shard is None else
                                                _bad_shard(shard))
    with pytest.raises(dataset.DatasetError) as err:
        dataset.load(tmp_path)
    one_line(err.value)


# ---------------------------------------------------------------- save points of a game
@pytest.fixture(scope="module")
def breakout_save():
    """Breakout played 5 chunks (3 kept for rewind): a backend, its save file's arrays and
    meta."""
    backend = GameEnvBackend(env=BREAKOUT, rewind_chunks=3)
    fire, left = backend.key_action(frozenset({"fire"})), backend.key_action(frozenset({"left"}))
    state = backend.new_state("play", 9)
    for action in (fire, fire, left, left, fire):
        backend.generate([ChunkJob(state, [action] * 2, 2)])
    arrays, scalars = export_state(backend, state)
    backend.free(state)
    meta = {"format": savepoint.SAVEPOINT_FORMAT, "model": backend.name,
            "model_version": savepoint.model_version(backend),
            "session": {"seed": 9, "prompt": "play", "action": 0, "frame_index": 10,
                        "chunk_frames": 2, "steps": 1, "mode": None, "fork_id": -1},
            "state": scalars}
    yield backend, arrays, meta
    backend.close()


def _paths(tree, prefix=()):
    """Every path into a JSON tree (dicts and lists), the root's too."""
    yield prefix
    items = tree.items() if isinstance(tree, dict) else enumerate(tree) \
        if isinstance(tree, list) else ()
    for key, value in items:
        yield from _paths(value, (*prefix, key))


@st.composite
def edited_save(draw, arrays: dict, meta: dict) -> bytes:
    """A save file edited by hand: scalars replaced or deleted anywhere in the state (and the
    session), arrays dropped, replaced or their bytes changed (the emulator state's too), then
    maybe the file's bytes cut or flipped."""
    arrays = {k: v.copy() for k, v in arrays.items()}
    meta = json.loads(json.dumps(meta))
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.integers(0, 5))
        if op <= 1:  # a scalar of the state (or the state itself)
            path = draw(st.sampled_from(list(_paths(meta["state"]))))
            parent, value = meta, draw(st.one_of(values, st.integers(-3, 2**32), st.none()))
            for key in ("state", *path[:-1]):
                parent = parent[key]
            last = path[-1] if path else "state"
            if op == 0 and isinstance(parent, dict):
                parent.pop(last, None)
            else:
                parent[last] = value
        elif op == 2:  # the session's part
            meta["session"][draw(st.sampled_from(sorted(meta["session"])))] = draw(values)
        elif op == 3:  # an array dropped or replaced by one of another shape or dtype
            key = draw(st.sampled_from(sorted(arrays) + ["history.7.frame", "now.other"]))
            if draw(st.booleans()):
                arrays.pop(key, None)
            else:
                with np.errstate(all="ignore"):
                    arrays[key] = np.full(draw(shapes), draw(fills)).astype(
                        draw(dtypes.filter(lambda d: d not in ("object", "U3"))))
        else:  # bytes of an array changed in place: the emulator state, a frame, the actions
            key = draw(st.sampled_from(sorted(arrays)))
            data = bytearray(arrays[key].tobytes())
            if data and op == 4:
                for _ in range(draw(st.integers(1, 6))):
                    data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
            else:
                data = data[:draw(st.integers(0, len(data)))]
            dtype = arrays[key].dtype
            data = data[:len(data) // dtype.itemsize * dtype.itemsize]
            arrays[key] = np.frombuffer(bytes(data), dtype=dtype).copy()
    raw = savepoint.encode(arrays, meta)
    if draw(st.integers(0, 4)) == 0:
        data = bytearray(raw)
        for _ in range(draw(st.integers(1, 4))):
            data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
        raw = bytes(data[:draw(st.integers(0, len(data)))])
    return raw


@given(st.data())
@settings(FUZZ, max_examples=150)
def test_an_edited_game_save_point_loads_and_plays_or_is_savepoint_error(breakout_save, data):
    """What loads is a game that plays and rewinds through all of its history (a damaged
    emulator state in the history failed the session at its rewind, long after the load)."""
    backend, arrays, meta = breakout_save
    raw = data.draw(edited_save(arrays, meta))
    try:
        got_arrays, got_meta = savepoint.decode(raw, backend)
        state = import_state(backend, got_arrays, got_meta["state"])
    except SavepointError as err:
        one_line(err)
        return
    try:
        (result,) = backend.generate([ChunkJob(state, [0, 1], 2)])
        assert result.error is None, result.error
        while state.history:
            backend.rewind(state, 1)
        (result,) = backend.generate([ChunkJob(state, [3], 2)])
        assert result.error is None, result.error
    finally:
        backend.free(state)


def test_a_save_point_without_its_state_is_refused_at_once(breakout_save):
    """``meta["state"]`` was read on the engine thread: a KeyError, which the route answered
    with 500."""
    backend, arrays, meta = breakout_save
    for state in (None, [], "x"):
        edited = {k: v for k, v in meta.items() if k != "state"}
        if state is not None:
            edited["state"] = state
        with pytest.raises(SavepointError, match="state is missing"):
            savepoint.decode(savepoint.encode(arrays, edited), backend)


@pytest.fixture(scope="module")
def game_app(breakout_engine, tmp_path_factory):
    limits = Limits(max_sessions=4, messages_per_s=1e9, message_burst=10**9,
                    auth_failure_burst=10**9, creation_burst=10**9)
    app = create_app(breakout_engine, limits, ui=False,
                     recording_dir=tmp_path_factory.mktemp("rec"))
    with TestClient(app, raise_server_exceptions=False) as client:
        s = create(client)
        saved = client.get(f"/api/sessions/{s['session_id']}/state", headers=auth(s))
        assert saved.status_code == 200, saved.text
        arrays, meta = savepoint.decode(saved.content, breakout_engine.backend)
        meta["session"] = meta["session"].model_dump()
        yield client, s, arrays, meta


def test_a_save_point_without_its_state_over_http_is_400_not_500(game_app):
    client, s, arrays, meta = game_app
    raw = savepoint.encode(arrays, {k: v for k, v in meta.items() if k != "state"})
    r = client.post(f"/api/sessions/{s['session_id']}/state", content=raw,
                    headers={**auth(s), "Content-Type": "application/octet-stream"})
    assert (r.status_code, r.json()["field"]) == (400, "state"), r.text


@given(st.data())
@settings(FUZZ, max_examples=20)
def test_an_edited_game_save_point_over_http_is_200_or_400(game_app, data):
    client, s, arrays, meta = game_app
    raw = data.draw(edited_save(arrays, meta))
    r = client.post(f"/api/sessions/{s['session_id']}/state", content=raw,
                    headers={**auth(s), "Content-Type": "application/octet-stream"})
    assert r.status_code in (200, 400), (r.status_code, r.text[:300])
    assert client.get(f"/api/sessions/{s['session_id']}/state",
                      headers=auth(s)).status_code == 200  # the session goes on


# ---------------------------------------------------------------- input logs with game keys
@pytest.fixture(scope="module")
def short_log():
    """An input log of the 12-step game (episodes end): held keys, a rewind, a fork adopted."""
    from tests.studio.test_replay import record_session
    from worldstream.engine.core.api import ActionCommand, AdoptCommand, ForkCommand, RewindCommand

    plan = [(2, ActionCommand(1, 0.0, frozenset({"right"}))), (6, ForkCommand(2, 2)),
            (8, AdoptCommand(3, 1)), (10, RewindCommand(4, 1)),
            (12, ActionCommand(5, 0.0, frozenset({"left"})))]
    config = EngineConfig(max_sessions=2, fps=60, chunk_frames=2)
    with Engine(GameEnvBackend(env=SHORT, size=16), config) as engine:
        return record_session(engine, "play", 3, plan, 20)[1]


#: events as a replay meets them: well formed (kinds in any order, keys near the game's)
_at = {"chunk": st.integers(0, 12), "frame": st.integers(0, 30)}
game_keys = st.lists(st.sampled_from(["left", "right", "up", "fire", "left_2", "a"]),
                     max_size=5)
good_events = st.one_of(
    st.fixed_dictionaries({"kind": st.just("action"), **_at, "keys": game_keys}),
    st.fixed_dictionaries({"kind": st.just("rewind"), **_at, "chunks": st.integers(1, 4)}),
    st.fixed_dictionaries({"kind": st.just("fork"), **_at, "k": st.integers(1, 3),
                           "fork_id": st.integers(0, 3)}),
    st.fixed_dictionaries({"kind": st.just("adopt"), **_at, "branch": st.integers(0, 3)}),
    st.fixed_dictionaries({"kind": st.just("preview"), **_at, "branch": st.integers(0, 3),
                           "steps": st.integers(1, 2)}),
    st.fixed_dictionaries({"kind": st.just("steps"), **_at, "steps": st.integers(1, 3)}),
    st.fixed_dictionaries({"kind": st.just("cut"), **_at, "prompt": st.just("x"),
                           "seed": st.integers(0, 5)}),
    st.fixed_dictionaries({"kind": st.just("controls"), **_at, "expression": st.just("smile")}))
#: and malformed
bad_events = st.fixed_dictionaries(
    {"kind": st.sampled_from(["action", "rewind", "fork", "x"]),
     "chunk": st.one_of(st.integers(0, 12), st.sampled_from([-1, True, 1.0, "1", 2**70])),
     "frame": st.integers(0, 30)},
    optional={"keys": key_lists, "chunks": st.integers(-1, 4), "k": st.integers(0, 5),
              "extra": values})


@st.composite
def edited_log(draw, log: dict) -> bytes:
    """A game's input log edited by hand: events' keys replaced, events inserted (mostly well
    formed, in chunk order), header fields replaced or dropped, maybe the text cut."""
    log = json.loads(json.dumps(log))
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from([0, 0, 1, 1, 1, 1, 2, 3, 4]))
        events = log.get("events")
        if op <= 2 and not isinstance(events, list):
            continue  # replaced by another edit
        if op == 0 and events:  # an event's keys (or any field) replaced
            event = draw(st.sampled_from(events))
            field = draw(st.sampled_from(["keys"] * 6 + ["chunk", "kind", "extra"]))
            event[field] = draw(st.one_of(game_keys, key_lists) if field == "keys" else values)
        elif op <= 2:  # events inserted
            at = draw(st.integers(0, len(events)))
            events[at:at] = draw(st.lists(good_events if op == 1 else bad_events, min_size=1,
                                          max_size=3))
            if op == 1:
                events.sort(key=lambda e: e["chunk"] if type(e.get("chunk")) is int else 0)
        elif op == 3:  # a header field replaced ("chunks" kept small: a replay plays them)
            field = draw(st.sampled_from(sorted(log)))
            log[field] = draw(st.integers(0, 40) if field == "chunks" else
                              st.one_of(values, st.sampled_from(
                                  ["game-sim:os:fork", "game-sim:tests.fixtures.games:np",
                                   f"game-builtin:{SHORT}", "sim", "game-sim:"])))
        elif log:
            log.pop(draw(st.sampled_from(sorted(log))))
    raw = json.dumps(log, allow_nan=True)
    if draw(st.integers(0, 7)) == 0:
        raw = raw[:draw(st.integers(0, len(raw)))]
    return raw.encode()


@given(st.data())
@settings(FUZZ, max_examples=60)
def test_an_edited_game_log_becomes_a_dataset_or_one_line_value_error(short_log, data):
    """``record --from-log``: keys the game lacks, malformed events and headers, another
    model (a hostile env id among them), a cut text: a ValueError of one line, nothing
    written."""
    raw = data.draw(edited_log(short_log))
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "data"
        try:
            meta = dataset_from_log(raw, out, backend=GameEnvBackend(env=SHORT, size=16))
        except ValueError as err:  # ReplayError, GameEnvError, a schema's
            one_line(err)
            assert not out.exists() and not out.with_name("data.partial").exists()
            return
        _, episodes = dataset.load(out, env_id=SHORT)
        assert len(episodes) == meta["frames"]


@given(st.one_of(values.map(lambda v: json.dumps(v, allow_nan=True)), st.text(max_size=200)))
@settings(FUZZ, max_examples=150)
def test_any_log_text_is_read_or_one_line_value_error(raw):
    try:
        log = read_log(raw)
    except ValueError as err:
        one_line(err)
        return
    for event in log.events:  # a game's log: key names of the wire pattern only
        for key in getattr(event, "keys", []):
            assert WIRE.fullmatch(key), key


def test_a_log_naming_a_hostile_env_loads_no_module(short_log, tmp_path, monkeypatch):
    """``record --from-log`` (and ``replay``) load the backend an input log names: the log
    is a file from anywhere."""
    import os

    monkeypatch.setattr(os, "fork", lambda: pytest.fail("os.fork called"))
    for env_id in ("os:fork", "tests.fixtures.games:np", EXITS):
        raw = json.dumps(dict(short_log, model=f"game-sim:{env_id}")).encode()
        with pytest.raises(ValueError) as err:
            dataset_from_log(raw, tmp_path / "out")
        one_line(err.value)
        assert not (tmp_path / "out").exists()



def test_a_damaged_emulator_state_in_the_history_is_refused_at_load(breakout_save):
    """The history's snapshots were restored only at a rewind: a damaged one loaded, and the
    rewind then failed the session (SystemError out of ale_py). So was one whose emulator
    state was dropped (replayed from a seed out of range)."""
    backend, arrays, meta = breakout_save
    native = bytearray(arrays["history.0.native"].tobytes())
    native[::7] = bytes(b ^ 0xFF for b in native[::7])
    damaged = dict(arrays, **{"history.0.native": np.frombuffer(bytes(native), np.uint8)})
    dropped = {k: v for k, v in arrays.items() if k != "history.1.native"}
    edited = json.loads(json.dumps(meta))
    edited["state"]["history"][1]["seed"] = -5
    for got_arrays, got_meta in ((damaged, meta), (dropped, edited)):
        raw = savepoint.encode(got_arrays, got_meta)
        with pytest.raises(SavepointError) as err:
            decoded, decoded_meta = savepoint.decode(raw, backend)
            import_state(backend, decoded, decoded_meta["state"])
        one_line(err.value)


def test_a_log_taking_a_branch_no_fork_made_or_a_control_the_game_lacks_is_refused(
        short_log, tmp_path):
    """IndexError and AttributeError out of the replay (``record --from-log``, ``replay``)."""
    at = {"chunk": 0, "frame": 0}
    for event, message in (({"kind": "adopt", "branch": 3}, "branch 3 of a fork of 0"),
                           ({"kind": "preview", "branch": 1, "steps": 1}, "branch 1"),
                           ({"kind": "controls", "expression": "smile"}, "no apply_controls")):
        raw = json.dumps(dict(short_log, events=[{**event, **at}, *short_log["events"]]))
        with pytest.raises(ValueError, match=message) as err:
            dataset_from_log(raw.encode(), tmp_path / "out",
                             backend=GameEnvBackend(env=SHORT, size=16))
        one_line(err.value)
        assert not (tmp_path / "out").exists()
