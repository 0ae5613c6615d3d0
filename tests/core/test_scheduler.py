"""Scheduler bookkeeping on a fake clock: EDF batching, playout clock, degradation levels."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from worldstream.engine.core.config import EngineConfig
from worldstream.engine.core.playout import NS, DegradeController, PlayoutClock
from worldstream.engine.core.scheduler import ChunkRequest, plan_batch

MS = 1_000_000


def _s(sid):
    """A stand-in session: planning reads only its id (ties broken by it)."""
    return SimpleNamespace(session_id=sid)


def _req(sid, deadline_ms, cf=2, steps=4, branch=None):
    return ChunkRequest(_s(sid), branch, cf, steps, deadline_ms * MS, deadline_ms * MS)


def test_plan_batch_is_earliest_deadline_first_and_groups_by_shape():
    requests = [
        _req("late", 300),
        _req("urgent", 100, steps=2),
        _req("soon", 150, steps=2),
        _req("odd", 120, cf=3, steps=2),  # same steps, other chunk size: not batchable
        _req("later", 400, steps=2),
        _req("urgent", 100, steps=2, branch=0),
    ]
    plan = plan_batch(requests, max_batch=8)
    assert (plan.chunk_frames, plan.steps) == (2, 2)
    order = [(r.session.session_id, r.branch) for r in plan.requests]
    # the stream before its own branch at equal deadline, then by deadline
    assert order == [("urgent", None), ("urgent", 0), ("soon", None), ("later", None)]
    plan = plan_batch(requests, max_batch=2)
    order = [(r.session.session_id, r.branch) for r in plan.requests]
    assert order == [("urgent", None), ("urgent", 0)]
    assert plan_batch([], 4) is None
    with pytest.raises(ValueError):
        plan_batch(requests, 0)


def test_eligible_requests_only_join_an_urgent_one():
    waiting = ChunkRequest(_s("b"), None, 2, 4, 90 * MS, 10 * MS, urgent=False)
    assert plan_batch([waiting], 4) is None  # eligible, not urgent: wait for company
    head = _req("a", 100)
    other = ChunkRequest(_s("c"), None, 2, 1, 50 * MS, 10 * MS, urgent=False)
    plan = plan_batch([other, waiting, head], 4)
    # the urgent head leads though "waiting" has the earlier deadline; "other" differs in steps
    assert [r.session.session_id for r in plan.requests] == ["a", "b"]


def test_playout_clock_hand_worked():
    clock = PlayoutClock(fps=10, created_ns=5 * NS)
    # before the first frame: nothing presented, the first chunk is wanted at creation
    assert clock.presented(9 * NS) == 0.0 and clock.deadline_ns(0) == 5 * NS
    clock.anchor(0, 1 * NS)
    assert clock.presented(1 * NS + 250 * MS) == pytest.approx(2.5)
    assert clock.buffer_frames(4, 1 * NS + 250 * MS) == pytest.approx(1.5)
    assert clock.deadline_ns(4) == 1 * NS + 400 * MS  # frame 4 is shown at 0.4 s
    # next chunk of 2 keeps a buffer of at most 4 once frame 2 is presented
    assert clock.due_at_ns(4, 2, 4) == 1 * NS + 200 * MS
    clock.set_fps(20, 1 * NS + 500 * MS)  # 5 frames presented; from now on 20 fps
    assert clock.presented(1 * NS + 500 * MS) == pytest.approx(5.0)
    assert clock.presented(2 * NS) == pytest.approx(15.0)
    clock.anchor(7, 3 * NS)  # re-anchor after a stall
    assert clock.buffer_frames(7, 3 * NS) == 0.0
    with pytest.raises(ValueError):
        PlayoutClock(0, 0)


def test_degrade_levels_drop_steps_then_fps():
    ctl = DegradeController(4, 20, min_steps=1, min_fps=4, factor=0.75, misses=2, recover=3)
    levels = []
    for level in range(ctl.max_level + 1):
        ctl.level = level
        levels.append((ctl.steps, ctl.fps))
    # 20·0.75^k rounded: 15, 11 (11.25), 8 (8.44), 6 (6.33), 5 (4.75), 4 (3.56 -> min 4)
    assert levels == [(4, 20), (3, 20), (2, 20), (1, 20), (1, 15), (1, 11), (1, 8), (1, 6),
                      (1, 5), (1, 4)]
    ctl.level = 0
    assert [ctl.record(late) for late in (True, False, True, True)] == [0, 0, 0, 1]
    assert (ctl.steps, ctl.fps, ctl.degraded) == (3, 20, True)
    assert [ctl.record(False) for _ in range(3)] == [0, 0, -1]
    assert not ctl.degraded
    ctl.level = ctl.max_level
    assert [ctl.record(True) for _ in range(4)] == [0, 0, 0, 0]  # nothing left to degrade
    ctl.set_requested(steps=2, fps=10)  # a client setting clamps the level to the new range
    assert ctl.level == ctl.max_level and (ctl.steps, ctl.fps) == (1, 4)


def test_degrade_levels_skip_step_counts_that_cost_no_less():
    """With the built-in landscape's forwards before a chunk's frames (4 steps: 3, as many as
    3 steps; 2: 2, 1: 1) a late session at 4 steps skips 3 steps, then lowers its fps; from 3
    steps each count is cheaper than the one above. A client setting rebuilds the ladder."""
    cost = {4: 3, 3: 3, 2: 2, 1: 1}.__getitem__
    ctl = DegradeController(4, 20, min_steps=1, min_fps=4, factor=0.75, misses=1, recover=1,
                            step_cost=cost)
    levels = []
    for level in range(ctl.max_level + 1):
        ctl.level = level
        levels.append((ctl.steps, ctl.fps))
    assert levels == [(4, 20), (2, 20), (1, 20), (1, 15), (1, 11), (1, 8), (1, 6), (1, 5),
                      (1, 4)]
    ctl.level = 0
    assert ctl.record(True) == 1 and ctl.steps == 2
    ctl.set_requested(steps=3)
    ladder = []
    for level in range(3):
        ctl.level = level
        ladder.append(ctl.steps)
    assert ladder == [3, 2, 1]


def test_config_validation_names_the_field():
    EngineConfig()
    for kwargs, name in [({"steps": 5}, "steps"), ({"max_sessions": 0}, "max_sessions"),
                         ({"chunk_frames": 17}, "chunk_frames"), ({"fps": 1}, "fps"),
                         ({"min_steps": 3, "steps": 2}, "min_steps"),
                         ({"fps_degrade_factor": 1.0}, "fps_degrade_factor"),
                         ({"retry_after_s": 0}, "retry_after_s"),
                         ({"max_batch": 2.5}, "max_batch")]:
        with pytest.raises(ValueError, match=name):
            EngineConfig(**kwargs)


def test_engine_refuses_a_buffer_smaller_than_the_models_chunk():
    from worldstream.engine.backends.sim.backend import SimBackend
    from worldstream.engine.core.engine import Engine

    backend = SimBackend(chunk_frames=4)
    for kwargs in ({"buffer_max_frames": 3, "batch_join_frames": 0},
                   {"buffer_max_frames": 8, "batch_join_frames": 5}):
        with pytest.raises(ValueError, match="buffer_max_frames"):
            Engine(backend, EngineConfig(chunk_frames=4, **kwargs))


def test_a_preview_batch_does_not_pull_streams_ahead():
    """Issue 12: a neighbour forking every 40 ms made previews the urgent head, streams joined
    their batches early (on older keys) and lost a frame interval of latency."""
    preview = ChunkRequest(_s("flooder"), 0, 1, 2, 10 * MS, 10 * MS, urgent=True)
    other_preview = ChunkRequest(_s("flooder"), 1, 1, 2, 10 * MS, 10 * MS, urgent=True)
    stream = ChunkRequest(_s("victim"), None, 1, 2, 90 * MS, 40 * MS, urgent=False)
    plan = plan_batch([preview, other_preview, stream], max_batch=8)
    order = [(r.session.session_id, r.branch) for r in plan.requests]
    assert order == [("flooder", 0), ("flooder", 1)]
    # a stream's own batch still takes streams joining early and urgent previews only
    head = ChunkRequest(_s("other"), None, 1, 2, 5 * MS, 5 * MS, urgent=True)
    waiting = ChunkRequest(_s("flooder"), 2, 1, 2, 30 * MS, 30 * MS, urgent=False)
    plan = plan_batch([head, stream, preview, waiting], max_batch=8)
    assert [(r.session.session_id, r.branch) for r in plan.requests] == [
        ("other", None), ("flooder", 0), ("victim", None)]
