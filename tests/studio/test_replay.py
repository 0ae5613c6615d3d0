"""Exact replay: a session steered live through the engine (actions, three prompt switches, a
fork and an adopt, a rewind, a settings change) exports its input log; replaying the log
headless reproduces every frame of the original stream bit for bit (simulator and built-in
model)."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from worldstream.engine.backends.sim.backend import SimBackend
from worldstream.engine.core.api import (
    ActionCommand,
    AdoptCommand,
    ForkCommand,
    PromptCommand,
    RewindCommand,
    SettingsCommand,
)
from worldstream.engine.core.config import EngineConfig
from worldstream.engine.core.engine import Engine
from worldstream.engine.core.inputlog import parse_log
from worldstream.engine.studio import worldio
from worldstream.engine.studio.replay import ReplayError, replay


def _action(seq, *keys):
    return ActionCommand(seq, 0.0, frozenset(keys))


def _prompt(seq, text, blend=None, weight=0.0):
    return PromptCommand(seq, 0.0, text, blend, weight)


def record_session(engine, prompt, seed, plan, end_frame, timeout_s=600):
    """Steer a new session live: ``plan`` = [(frame, command)], each submitted once the
    stream has shown ``frame`` frames (a fork waits for its previews before going on).
    Returns (the stream's frames up to the exported log's end, the log)."""
    sid = engine.create_session(prompt, seed=seed).session_id
    slot = engine.subscribe(sid, maxlen=100_000)
    events = engine.events(sid)
    frames = []
    deadline = time.monotonic() + timeout_s

    def pump(until):
        while len(frames) < until:
            assert time.monotonic() < deadline, f"only {len(frames)} frames"
            frame = slot.get(timeout=1.0)
            if frame is not None:
                frames.append(frame.rgb)

    for frame, command in plan:
        pump(frame)
        engine.submit(sid, command)
        if isinstance(command, ForkCommand):
            previews = 0
            while previews < command.k:
                event = events.get(timeout=max(deadline - time.monotonic(), 0.1))
                assert event.kind != "error", event.payload
                previews += event.kind == "preview"
    pump(end_frame)
    log = worldio.export_log(engine, sid).result(timeout=60)
    pump(log["frames"])
    engine.close_session(sid)
    return np.stack(frames[:log["frames"]]), log


PLAN = [
    (3, _action(1, "right")), (12, _action(2, "down", "right")),
    (20, _prompt(3, "a snowy forest")), (28, ForkCommand(4, 2)), (30, AdoptCommand(5, 1)),
    (36, _prompt(6, "hot desert dunes", "a snowy forest", 0.3)), (44, RewindCommand(7, 2)),
    (48, _action(8, "up")), (52, _action(7, "left")),  # an older seq: ignored, as live
    (56, _prompt(9, "a dark landscape at night")), (60, _action(10)),
]


def test_sim_session_replays_bit_identically_and_the_log_names_everything():
    config = EngineConfig(max_sessions=2, fps=60, chunk_frames=2)
    with Engine(SimBackend(), config) as engine:
        plan = [*PLAN, (64, SettingsCommand(11, chunk_frames=3, steps=2)),
                (70, _action(12, "down"))]
        original, log = record_session(engine, "a green meadow with ponds", 11, plan, 90)
    kinds = [e["kind"] for e in log["events"]]
    assert kinds.count("prompt") == 3 and kinds.count("rewind") == 1
    assert kinds.count("fork") == 1 and kinds.count("adopt") == 1
    assert kinds.count("preview") >= 2  # the adopted branch was generated before its adoption
    assert kinds.count("action") == 5  # the stale action (seq 7 after 8) was not applied
    assert log["start"] == {"kind": "prompt"} and log["seed"] == 11
    got = []
    summary = replay(SimBackend(), parse_log(json.dumps(log)), got.append)
    replayed = np.concatenate(got)
    assert summary["frames"] == len(original) == log["frames"] >= 90
    assert np.array_equal(replayed, original)
    # the rewind and adopt mattered: without them the frames differ
    cut = dict(log, events=[e for e in log["events"] if e["kind"] != "rewind"])
    got.clear()
    replay(SimBackend(), parse_log(json.dumps(cut)), got.append)
    assert not np.array_equal(np.concatenate(got), original)


def test_replay_refuses_another_model_or_version():
    backend = SimBackend()
    log = {"format": "worldstream-input-log/1", "model": "builtin", "model_version": "0" * 64,
           "start": {"kind": "prompt"}, "seed": 0, "prompt": "a snowy forest",
           "chunk_frames": 2, "steps": 2, "fps": 20, "chunks": 2, "frames": 4, "events": []}
    with pytest.raises(ReplayError, match="recorded with model 'builtin'"):
        replay(backend, parse_log(json.dumps(log)), lambda f: None)
    with pytest.raises(ReplayError, match="another version of model 'sim'"):
        replay(backend, parse_log(json.dumps(dict(log, model="sim"))), lambda f: None)


@pytest.mark.parametrize(("change", "message"), [
    ({"events": [{"kind": "jump", "chunk": 0, "frame": 0}]}, "events.0"),
    ({"events": [{"kind": "action", "chunk": 0, "frame": 0, "keys": ["jump"]}]},
     "events.0.action.keys.0"),
    ({"chunks": -1}, "chunks"),
    ({"format": "other/1"}, "format 'other/1'"),
    ({"events": [{"kind": "rewind", "chunk": 3, "frame": 6, "chunks": 1},
                 {"kind": "rewind", "chunk": 1, "frame": 2, "chunks": 1}]}, "must not decrease"),
])
def test_bad_logs_get_one_line_naming_the_field(change, message):
    log = {"format": "worldstream-input-log/1", "model": "sim", "model_version": "0",
           "start": {"kind": "prompt"}, "seed": 0, "prompt": "a snowy forest",
           "chunk_frames": 2, "steps": 2, "fps": 20, "chunks": 2, "frames": 4, "events": []}
    with pytest.raises(ValueError, match=message) as err:
        parse_log(json.dumps({**log, **change}))
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="not valid JSON"):
        parse_log(b"{truncated")


@pytest.fixture(scope="module")
def builtin():
    from worldstream.engine.backends.builtin import load_builtin_backend

    return load_builtin_backend()


@pytest.mark.slow
def test_builtin_session_replays_bit_identically(builtin):
    # a slow machine degrades the steps mid-stream: the log records it, the replay follows
    config = EngineConfig(max_sessions=2, fps=15, steps=2, rewind_chunks=4)
    plan = [(f, c) for f, c in PLAN if not isinstance(c, RewindCommand)] + [
        (44, RewindCommand(7, 3))]
    plan.sort(key=lambda p: p[0])
    with Engine(builtin, config) as engine:
        original, log = record_session(engine, "a green meadow with ponds", 5, plan, 66)
    got = []
    replay(builtin, parse_log(json.dumps(log)), got.append)
    replayed = np.concatenate(got)
    assert len(replayed) == len(original) == log["frames"] >= 66
    equal = [np.array_equal(a, b) for a, b in zip(replayed, original)]
    assert all(equal), f"first differing frame: {equal.index(False)}"


def test_a_log_past_its_bound_stops_and_refuses_export(monkeypatch):
    from worldstream.engine.core import inputlog

    monkeypatch.setattr(inputlog, "MAX_LOG_EVENTS", 3)
    log = inputlog.InputLog({"kind": "prompt"}, seed=0, prompt="a", chunk_frames=1, steps=1,
                            fps=10, chunk0=5, frame0=5)
    for i in range(4):
        log.add("rewind", 5 + i, 5 + i, chunks=1)
    assert log.overflowed
    with pytest.raises(ValueError, match="passed 3 events"):
        log.to_dict(model="sim", model_version="v", chunk=9, frame=9)


def test_avatar_session_replays_its_expressions_and_speech_bit_identically():
    # the avatar's own controls travel in "controls" events; a stale action's keys are
    # ignored but the expression it carried was applied live, so it is logged and replayed
    from worldstream.engine.backends.avatar.sim import AvatarSimBackend

    config = EngineConfig(max_sessions=2, fps=60, chunk_frames=2)
    plan = [
        (4, ActionCommand(1, 0.0, frozenset({"left"}), expression="smile")),
        (10, ActionCommand(2, 0.0, frozenset(), say="hello there how are you")),
        (20, ActionCommand(4, 0.0, frozenset({"up"}))),
        (24, ActionCommand(3, 0.0, frozenset({"down"}), expression="surprise")),  # stale keys
        (30, RewindCommand(5, 2)),
    ]
    with Engine(AvatarSimBackend(), config) as engine:
        original, log = record_session(engine, "a video call from the office", 5, plan, 60)
    controls = [e for e in log["events"] if e["kind"] == "controls"]
    assert [(e.get("expression"), e.get("say")) for e in controls] == [
        ("smile", None), (None, "hello there how are you"), ("surprise", None)]
    assert [e["keys"] for e in log["events"] if e["kind"] == "action"] == [
        ["left"], [], ["up"]]
    got = []
    replay(AvatarSimBackend(), parse_log(json.dumps(log)), got.append)
    assert np.array_equal(np.concatenate(got), original)
    # the controls mattered: a log without them makes other frames
    cut = dict(log, events=[e for e in log["events"] if e["kind"] != "controls"])
    got.clear()
    replay(AvatarSimBackend(), parse_log(json.dumps(cut)), got.append)
    assert not np.array_equal(np.concatenate(got), original)


def test_a_controls_event_needs_one_control():
    log = {"format": "worldstream-input-log/1", "model": "avatar-sim", "model_version": "x",
           "start": {"kind": "prompt"}, "seed": 0, "prompt": "an office", "chunk_frames": 1,
           "steps": 1, "fps": 20, "chunks": 1, "frames": 1,
           "events": [{"kind": "controls", "chunk": 0, "frame": 0}]}
    with pytest.raises(ValueError, match="events.0.controls"):
        parse_log(json.dumps(log))
    log["events"][0]["say"] = "x" * 201
    with pytest.raises(ValueError, match="events.0.controls.say"):
        parse_log(json.dumps(log))
