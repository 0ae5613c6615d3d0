"""Actions beyond keys through the engine: a backend that declares an action space gets
per-frame action vectors (held keys multi-hot, mouse motion summed between chunks, spread over
the chunk's frames, scaled); bad pointer values and unknown keys are refused with an error
naming the field and change nothing; a world without mouse input ignores a pointer (v1); input
logs record the motion and replay it frame for frame; save points keep it."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from tests.fixtures.engine import EchoBackend, cfg, collect, drain_events, wait_for
from tests.fixtures.mouse import LOOK_SCALE, LookBackend
from tests.studio.test_replay import record_session
from worldstream.engine.core.action_space import ActionSpace, check_pointer
from worldstream.engine.core.api import ActionCommand, AdoptCommand, ForkCommand, RewindCommand
from worldstream.engine.core.engine import Engine
from worldstream.engine.core.inputlog import parse_log
from worldstream.engine.studio import worldio
from worldstream.engine.studio.replay import replay
from worldstream.engine.studio.savepoint import SavedSession
from worldstream.streaming import messages as m


def test_frame_controls_are_multi_hot_keys_and_scaled_spread_motion():
    space = ActionSpace(("a", "b", "c"), mouse=True, mouse_scale=(0.5, -0.5), mouse_limit=1.0)
    rows = space.frame_controls(frozenset({"c", "a"}), (8.0, 4.0), 4)
    assert rows == [(1.0, 0.0, 1.0, 1.0, -0.5)] * 4
    assert space.frame_controls(frozenset(), (80.0, 0.0), 4)[0][3] == 1.0  # clipped
    assert ActionSpace(("a",)).frame_controls(frozenset({"a"}), (9.0, 9.0), 2) == [(1.0,)] * 2
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['d'\]"):
        space.frame_controls(frozenset({"d"}), (0.0, 0.0), 1)
    for bad in ([math.nan, 0], [0, math.inf], [1e6, 0], [1, 2, 3], "12", [True, 0]):
        with pytest.raises(ValueError, match="pointer"):
            check_pointer(bad)


def test_pointer_motion_reaches_the_next_chunk_once():
    backend = LookBackend()
    with Engine(backend, cfg(fps=60)) as engine:
        sid = engine.create_session("look", seed=1).session_id
        slot = engine.subscribe(sid, maxlen=1000)
        assert len(collect(slot, 4)) == 4
        engine.submit(sid, ActionCommand(1, 0.0, frozenset({"right"}), pointer=(8.0, -4.0)))
        engine.submit(sid, ActionCommand(2, 0.0, frozenset({"right"}), pointer=(4.0, 0.0)))
        assert wait_for(lambda: any(j.controls[0][3] for j in list(backend.jobs)))  # right
        collect(slot, 12)
    moving = [j for j in backend.jobs if j.controls[0][4] or j.controls[0][5]]
    # each chunk's motion is the same on its frames; all of it adds up to the pointer's, once
    assert all(len(set(j.controls)) == 1 for j in backend.jobs)
    assert sum(r[4] for j in moving for r in j.controls) == pytest.approx(12 * LOOK_SCALE)
    assert sum(r[5] for j in moving for r in j.controls) == pytest.approx(4 * LOOK_SCALE)
    assert backend.jobs[-1].controls[-1] == (0.0, 0.0, 0.0, 1.0, 0.0, 0.0)  # right held


def test_bad_pointers_and_unknown_keys_are_refused_and_change_nothing():
    backend = LookBackend()
    with Engine(backend, cfg(fps=60)) as engine:
        sid = engine.create_session("look", seed=1).session_id
        events = engine.events(sid)
        engine.submit(sid, ActionCommand(1, 0.0, frozenset({"up"}), pointer=(2.0, 0.0)))
        for seq, keys, pointer in ((2, {"up"}, (math.nan, 0.0)), (3, {"up"}, (1e9, 0.0)),
                                   (4, {"fire"}, (1.0, 0.0))):
            engine.submit(sid, ActionCommand(seq, 0.0, frozenset(keys), pointer=pointer))
        assert wait_for(lambda: len([e for e in list(events.queue) if e.kind == "error"]) == 3)
        errors = [e.payload for e in drain_events(events) if e.kind == "error"]
        assert [(e["seq"], e["field"]) for e in errors] == [(2, "pointer"), (3, "pointer"),
                                                            (4, "keys")]
        assert "exceeds the limit of 2048" in errors[1]["message"]
        log = worldio.export_log(engine, sid).result(timeout=10)
    actions = [e for e in log["events"] if e["kind"] == "action"]
    assert [(e["keys"], e["pointer"]) for e in actions] == [(["up"], [2.0, 0.0])]
    moved = sum(r[4] for j in backend.jobs for r in j.controls)
    assert moved == pytest.approx(2.0 * LOOK_SCALE)  # only the valid action's motion


def test_a_world_without_mouse_input_ignores_a_pointer_as_v1_did():
    with Engine(EchoBackend(), cfg(fps=60)) as engine:
        sid = engine.create_session("echo", seed=1).session_id
        events = engine.events(sid)
        engine.submit(sid, m.to_command(m.parse_client_message(
            '{"type":"action","seq":1,"t":0,"keys":["up"],"pointer":[3,4]}')))
        assert wait_for(lambda: worldio.export_log(engine, sid).result(timeout=5)["events"])
        log = worldio.export_log(engine, sid).result(timeout=5)
        assert [e for e in drain_events(events) if e.kind == "error"] == []
    assert log["events"][0]["keys"] == ["up"] and "pointer" not in log["events"][0]


def test_the_wire_bounds_a_pointer_and_carries_it_to_the_engine():
    command = m.to_command(m.parse_client_message(
        '{"type":"action","seq":1,"t":0,"keys":[],"pointer":[-2048,0.5]}'))
    assert command.pointer == (-2048.0, 0.5)
    with pytest.raises(m.MessageError) as err:
        m.parse_client_message('{"type":"action","seq":1,"t":0,"keys":[],"pointer":[1,3000]}')
    assert (err.value.code, err.value.field) == ("less_than_equal", "pointer.1")


def test_a_mouse_session_replays_bit_identically():
    plan = [(4, ActionCommand(1, 0.0, frozenset({"left"}), pointer=(20.0, 4.0))),
            (10, ActionCommand(2, 0.0, frozenset(), pointer=(-6.0, 0.0))),
            (14, ActionCommand(3, 0.0, frozenset(), pointer=(9.0, -3.0))),
            (16, ForkCommand(4, 2)), (18, AdoptCommand(5, 1)),
            (22, ActionCommand(6, 0.0, frozenset({"up"}), pointer=(30.0, 0.0))),
            (28, RewindCommand(7, 2)), (30, ActionCommand(8, 0.0, frozenset(), pointer=(-5, 2)))]
    with Engine(LookBackend(), cfg(fps=60, max_sessions=2)) as engine:
        original, log = record_session(engine, "look", 3, plan, 40, timeout_s=60)
    pointers = [e.get("pointer") for e in log["events"] if e["kind"] == "action"]
    assert pointers == [[20.0, 4.0], [-6.0, 0.0], [9.0, -3.0], [30.0, 0.0], [-5.0, 2.0]]
    got = []
    replay(LookBackend(), parse_log(json.dumps(log)), got.append)
    assert np.array_equal(np.concatenate(got), original)
    # the motion mattered: without it the frames differ
    still = dict(log, events=[{k: v for k, v in e.items() if k != "pointer"}
                              for e in log["events"]])
    got.clear()
    replay(LookBackend(), parse_log(json.dumps(still)), got.append)
    assert not np.array_equal(np.concatenate(got), original)


def test_save_points_keep_the_held_keys_and_pending_motion():
    old = {"seed": 1, "prompt": "a", "action": 0, "frame_index": 0, "chunk_frames": 2,
           "steps": 2, "mode": None, "fork_id": -1}
    assert SavedSession.model_validate(old).pointer == [0.0, 0.0]  # a file of before
    saved = SavedSession.model_validate({**old, "keys": ["up"], "pointer": [3.5, -1.0]})
    assert (saved.keys, saved.pointer) == (["up"], [3.5, -1.0])
