"""Scale-down drains first (issue 55), on a local Ray with two emulated replicas: when the
sessions want one replica, the emptier one takes no new session, its session moves to the
other from its journal (frames go on, numbering on, ``recovered``), and only then is it
stopped. No namespaces needed."""

from __future__ import annotations

import time

import pytest

from tests.fixtures.engine import collect, drain_events, wait_for

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow


def test_a_surplus_replica_is_drained_its_session_moved_then_stopped():
    from worldstream.engine.cluster.router import RayEngine
    from worldstream.engine.core.config import EngineConfig

    engine = RayEngine("emulated", replicas=2, min_replicas=1, max_replicas=2, threads=None,
                       config=EngineConfig(max_sessions=4, fps=16, mode="responsive"),
                       model_kwargs={"frame_size": "128x128"}, monitor_period_s=0.25,
                       scale_down_after_s=0.5, drain_s=0.5)
    with engine:
        a = engine.create_session("a", seed=1).session_id
        b = engine.create_session("b", seed=2).session_id  # on the other replica
        assert sorted(len(r["sessions"]) for r in engine.metrics()["replicas"]) == [1, 1]
        slots = {sid: engine.subscribe(sid, 512) for sid in (a, b)}
        t0 = time.monotonic()
        assert wait_for(lambda: len(engine.metrics()["replicas"]) == 1, timeout=20,
                        step=0.1)
        drained_s = time.monotonic() - t0
        (survivor,) = engine.metrics()["replicas"]
        assert sorted(survivor["sessions"]) == sorted([a, b]) and survivor["failovers"] == 1
        for sid, slot in slots.items():
            seen = collect(slot, 512, timeout=0.2)  # all so far, then a few more
            seen += collect(slot, 5, timeout=10)
            indices = [f.index for f in seen]
            assert len(indices) >= 5 and indices == sorted(set(indices)), sid
        kinds = {sid: [e.kind for e in drain_events(engine.events(sid))] for sid in (a, b)}
        assert sorted(len([k for k in ks if k == "recovered"]) for ks in kinds.values()) \
            == [0, 1]
        assert not any("error" in ks for ks in kinds.values())
        assert drained_s < 15, drained_s
    assert not ray.is_initialized()
