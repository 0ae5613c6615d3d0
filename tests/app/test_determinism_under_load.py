"""The same script gives the same frames on a busy machine (issue 66). Each family that claims
exact replay plays one script twice while a process spins on another core and random sleeps
are injected where threads meet (the engine thread taking commands and running batches, frames
handed to the recorder's and the caller's threads), one run slow and one fast; every frame of
the two MP4s (decoded) must match: landscape, avatar, Pong and Breakout through ``generate``,
Matrix-Game's tiny config (which ``generate`` cannot name) through the same script player on
the engine. The same for ``generate --replay LOG``, a log played from a save point
(``--state``) and two sessions generated side by side in one process.

Before the fix, ``generate`` sent each key event on the wall clock (``frame / fps`` s after the
first frame) and the engine applied it to whichever chunk came next: under load the same
script took its keys at other frames and the videos parted there for good. The two runs share
one backend, as a server's sessions do, so a page or buffer reused without being written
first would show here too.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time

import av
import numpy as np
import pytest

from worldstream.app import cli
from worldstream.app.action_script import ActionScript, ScriptPlayer
from worldstream.engine.core import registry
from worldstream.engine.core.api import ActionCommand, FrameSlot
from worldstream.engine.core.batch import BatchRunner
from worldstream.engine.core.config import EngineConfig
from worldstream.engine.core.engine import Engine
from worldstream.engine.studio import worldio

FRAMES = 6  # the scripts' events at frames 2 and 4: the old bug moved them by one or more
DIRECTIONS = {"events": [{"frame": 0, "keys": []}, {"frame": 2, "keys": ["right"]},
                         {"frame": 4, "keys": ["down", "right"]}]}
GAME_KEYS = {"pong": ["up", "down"], "breakout": ["left", "right"]}
_BACKENDS: dict = {}  # one backend per model for the whole module, as a server keeps it


@pytest.fixture(scope="module")
def spinner():
    """One process spinning on another core for the module's tests."""
    proc = subprocess.Popen([sys.executable, "-c", "while 1: pass"])
    yield proc
    proc.kill()
    proc.wait()


@pytest.fixture
def shared_backends(monkeypatch):
    real = registry.load_backend

    def load(name, model_path=None, **kwargs):
        key = (name, model_path, json.dumps(kwargs, sort_keys=True, default=str))
        if key not in _BACKENDS:
            _BACKENDS[key] = real(name, model_path=model_path, **kwargs)
        return _BACKENDS[key]

    monkeypatch.setattr(registry, "load_backend", load)


def busy(monkeypatch, slow: bool, seed: int) -> None:
    """Random sleeps where threads meet; a slow run's engine thread sleeps 30-70 ms before
    each batch (as if the machine were loaded), a fast run's 0-5 ms."""
    rng = random.Random(seed)

    def nap(low_ms: float, high_ms: float) -> None:
        time.sleep(rng.uniform(low_ms, high_ms) / 1e3)

    def wrap(cls, name, low_ms, high_ms):
        original = getattr(cls, name)

        def napping(self, *args, **kwargs):
            nap(low_ms, high_ms)
            return original(self, *args, **kwargs)

        monkeypatch.setattr(cls, name, napping)

    wrap(BatchRunner, "run", *((30, 70) if slow else (0, 5)))
    wrap(Engine, "_handle", 0, 10)  # the engine thread taking a caller's command or call
    wrap(Engine, "submit", 0, 10)
    wrap(FrameSlot, "put", 0, 3)  # a frame handed to the recorder's and the caller's threads
    wrap(FrameSlot, "get_nowait", 0, 3)


def decode(path) -> list[np.ndarray]:
    with av.open(str(path)) as container:
        return [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]


def assert_same_frames(a: list[np.ndarray], b: list[np.ndarray], frames: int) -> None:
    assert (len(a), len(b)) == (frames, frames)
    differ = [i for i in range(frames) if not np.array_equal(a[i], b[i])]
    assert differ == [], f"the runs part at frame {differ[0]} ({len(differ)} of {frames} differ)"


def twice(monkeypatch, tmp_path, argv: list[str], outs: tuple[str, ...] = ("out.mp4",),
          tag: str = "run"):
    """``worldstream generate argv --out TAG{0,1}/out.mp4`` twice (slow, then fast); the
    decoded frames of each output of each run."""
    runs = []
    for run, slow in enumerate((True, False)):
        folder = tmp_path / f"{tag}{run}"
        folder.mkdir()
        with monkeypatch.context() as m:
            busy(m, slow, seed=run)
            assert cli.main(["generate", *argv, "--out", str(folder / "out.mp4")]) == 0
        runs.append([decode(folder / name) for name in outs])
    return runs


@pytest.mark.slow
@pytest.mark.parametrize("world", ["landscape", "avatar", "pong", "breakout"])
def test_one_script_twice_under_load_gives_the_same_frames(world, tmp_path, monkeypatch,
                                                          spinner, shared_backends):
    script = tmp_path / "actions.json"
    events = DIRECTIONS["events"]
    if world in GAME_KEYS:
        events = [{"frame": e["frame"], "keys": [GAME_KEYS[world][i % 2]] if e["keys"] else []}
                  for i, e in enumerate(events)]
    script.write_text(json.dumps({"events": events}))
    argv = ["--world", world, "--actions", str(script), "--seed", "7", "--frames", str(FRAMES)]
    if world in ("landscape", "avatar"):
        argv += ["--prompt", "hot desert dunes"]
    (a,), (b,) = twice(monkeypatch, tmp_path, argv)
    assert_same_frames(a, b, FRAMES)


@pytest.mark.slow
def test_two_sessions_side_by_side_twice_under_load(tmp_path, monkeypatch, spinner,
                                                   shared_backends):
    script = tmp_path / "actions.json"
    script.write_text(json.dumps(DIRECTIONS))
    argv = ["--actions", str(script), "--prompt", "hot desert dunes", "--seed", "7",
            "--frames", str(FRAMES), "--sessions", "2"]
    (a0, a1), (b0, b1) = twice(monkeypatch, tmp_path, argv, ("out_0.mp4", "out_1.mp4"))
    assert_same_frames(a0, b0, FRAMES)
    assert_same_frames(a1, b1, FRAMES)
    assert not np.array_equal(a0[-1], a1[-1])  # two sessions, not one stream written twice


def _live_log(engine: Engine, plan, frames: int, savepoint: bytes | None = None):
    """A session steered live (``plan``: ``[(frame, keys)]``, each sent once ``frame`` frames
    are out), loaded from ``savepoint`` first when given; its input log."""
    sid = engine.create_session("hot desert dunes", seed=7).session_id
    slot = engine.subscribe(sid, maxlen=1000)
    if savepoint is not None:
        worldio.load(engine, sid, savepoint).result(timeout=60)
    seen = 0
    for seq, (frame, keys) in enumerate(plan, 1):
        while seen < frame:
            seen += slot.get(timeout=30) is not None
        engine.submit(sid, ActionCommand(seq, 0.0, frozenset(keys)))
    while seen < frames:
        seen += slot.get(timeout=30) is not None
    log = worldio.export_log(engine, sid).result(timeout=60)
    save = worldio.save(engine, sid).result(timeout=60)
    engine.close_session(sid)
    return log, save


@pytest.mark.slow
def test_a_replayed_log_and_a_loaded_save_point_twice_under_load(tmp_path, monkeypatch, spinner,
                                                                 shared_backends):
    backend = registry.load_backend("builtin")
    with Engine(backend, EngineConfig(max_sessions=1, fps=15, steps=2)) as engine:
        log, save = _live_log(engine, [(2, {"right"}), (4, {"down"})], 6)
        loaded_log, _ = _live_log(engine, [(1, {"left"}), (3, {"up"})], 5, savepoint=save)
    assert loaded_log["start"]["kind"] == "savepoint"
    (tmp_path / "live.log.json").write_text(json.dumps(log))
    (tmp_path / "loaded.log.json").write_text(json.dumps(loaded_log))
    (tmp_path / "save.bin").write_bytes(save)
    (a,), (b,) = twice(monkeypatch, tmp_path, ["--replay", str(tmp_path / "live.log.json")],
                       tag="replay")
    assert_same_frames(a, b, log["frames"])
    (a,), (b,) = twice(monkeypatch, tmp_path, ["--replay", str(tmp_path / "loaded.log.json"),
                                               "--state", str(tmp_path / "save.bin")],
                       tag="loaded")
    assert_same_frames(a, b, loaded_log["frames"])


def _play_script(backend, events: list[dict], frames: int, seed: int, logs: list | None = None,
                 config: EngineConfig | None = None) -> np.ndarray:
    """What ``generate`` does with a script, for a model it cannot name (Matrix-Game): the
    session's first ``frames`` frames with the script played by frame index (its input log
    appended to ``logs``)."""
    keys = getattr(backend, "wire_keys", None)
    script = ActionScript.model_validate({"events": events},
                                         context={"keys": tuple(keys)} if keys else None)
    engine = Engine(backend, config or EngineConfig(max_sessions=1, fps=12, steps=1))
    try:
        sid = engine.create_session("play", seed=seed).session_id
        slot = engine.subscribe(sid, maxlen=1000)
        attached = engine.call(sid, ScriptPlayer(engine, script).attach)
        engine.start()
        attached.result(timeout=60)
        got = []
        while len(got) < frames:
            frame = slot.get(timeout=60)
            assert frame is not None, f"only {len(got)} frames"
            got.append(frame.rgb)
        if logs is not None:
            logs.append(worldio.export_log(engine, sid).result(timeout=60))
    finally:
        engine.stop()
    return np.stack(got)


def test_a_scripts_event_takes_effect_from_the_chunk_holding_its_frame(monkeypatch):
    from worldstream.engine.backends.sim.backend import SimBackend

    events = [{"frame": 0, "keys": ["up"]}, {"frame": 3, "keys": ["right"]},
              {"frame": 4, "keys": ["down"]}, {"frame": 7, "prompt": "a snowy forest"}]
    logs: list = []
    with monkeypatch.context() as m:
        busy(m, slow=True, seed=0)
        _play_script(SimBackend(chunk_frames=2), events, 10, seed=3, logs=logs)
    applied = [(e["frame"], e.get("keys", e.get("text"))) for e in logs[0]["events"]
               if e["kind"] in ("action", "prompt")]
    assert applied == [(0, ["up"]), (2, ["right"]), (4, ["down"]), (6, "a snowy forest")]


@pytest.mark.slow
def test_matrix_game_tiny_plays_one_script_twice_under_load(monkeypatch, spinner):
    from tests.app.test_matrix_game_page import engine_config, tiny_backend

    backend = tiny_backend("universal")
    frames = 2 * backend.chunk_frames  # a new key at the second chunk
    events = [{"frame": 0, "keys": ["forward"]},
              {"frame": backend.chunk_frames, "keys": ["look_left", "right"]}]
    runs = []
    for run, slow in enumerate((True, False)):
        with monkeypatch.context() as m:
            busy(m, slow, seed=run)
            runs.append(_play_script(backend, events, frames, seed=5, config=engine_config()))
    assert_same_frames(list(runs[0]), list(runs[1]), frames)
