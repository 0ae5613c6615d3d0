"""Autoscaling by draining (issue 55): a surplus replica takes no new session, its sessions end
or move before it stops, and it is taken back when the sessions return. Plain data and a
router that was never started: no Ray here (the real run is ``bench scale --ramp``)."""

from __future__ import annotations

import pytest

from worldstream.engine.cluster import scaling
from worldstream.engine.cluster.placement import Replica, RoutedSession, place
from worldstream.engine.cluster.scaling import Scaler, plan


def _rep(i: int, sessions: int = 0, draining_since: float | None = None,
         capacity: int = 4) -> Replica:
    return Replica(i, _Handle(), {"capacity": capacity, "address": "A"},
                   sessions={f"s{i}-{k}" for k in range(sessions)},
                   draining_since=draining_since)


class _Handle:
    """Records the calls a replica's actor handle gets."""

    def __init__(self):
        self.calls: list[tuple] = []

    def __getattr__(self, name):
        outer = self

        class _Method:
            def remote(self, *args):
                outer.calls.append((name, *args))

        return _Method()


def test_a_surplus_drains_only_after_it_lasted_and_the_emptiest_first():
    reps = [_rep(0, 3), _rep(1, 1), _rep(2, 1)]
    p = plan(reps, 1, 100.0, None, scale_down_after_s=5.0)
    assert p.surplus_since == 100.0 and not p.drain  # a dip: nothing yet
    p = plan(reps, 1, 105.0, p.surplus_since, scale_down_after_s=5.0)
    assert [r.id for r in p.drain] == [2, 1]  # fewest sessions, then the newest
    assert not p.stop and not p.launch


def test_a_drained_replica_stops_when_empty_and_moves_its_sessions_after_drain_s():
    a, b, c = _rep(0, 2), _rep(1, 1, draining_since=10.0), _rep(2, 0, draining_since=10.0)
    p = plan([a, b, c], 1, 12.0, None, drain_s=5.0)
    assert p.stop == [c] and not p.move  # b's session may still end by itself
    p = plan([a, b], 1, 15.0, None, drain_s=5.0)
    assert p.move == [b] and not p.stop


def test_sessions_coming_back_take_a_drained_replica_back_before_starting_one():
    a, b = _rep(0, 4), _rep(1, 1, draining_since=10.0)
    p = plan([a, b], 2, 11.0, 8.0)
    assert p.undrain == [b] and not p.launch and p.surplus_since is None
    p = plan([a, b], 3, 11.0, None)
    assert p.undrain == [b] and p.launch


def test_placement_never_picks_a_draining_replica():
    a, b = _rep(0, 3), _rep(1, 0, draining_since=1.0)
    assert place([a, b]) is a
    a.sessions |= {"x"}  # full: a draining replica is still no place
    assert place([a, b]) is None


def _engine(replicas: list[Replica], sessions_on: dict[str, int]):
    from worldstream.engine.cluster.router import RayEngine

    engine = RayEngine("sim", replicas=1, min_replicas=1, max_replicas=3)
    for rep in replicas:
        engine._replicas[rep.id] = rep
    for sid, rid in sessions_on.items():
        engine._sessions[sid] = RoutedSession(None, rid, f"r-{sid}", None)
        engine._by_remote[(rid, f"r-{sid}")] = sid
        engine._replicas[rid].sessions.add(sid)
    return engine


def _fake_recreate(fail: set[str]):
    def recreate(engine, sid, routed, source, target):
        assert target.pending == 1 and target.draining_since is None
        if sid in fail:
            raise RuntimeError("the target refused")
        routed.replica, routed.remote_id = target.id, f"new-{sid}"
        source.sessions.discard(sid)
        target.sessions.add(sid)
        return {"replica": target.id}
    return recreate


def test_a_scale_down_moves_or_keeps_sessions_and_never_closes_one(monkeypatch):
    keep, drained = _rep(0, capacity=8), _rep(1, capacity=8)
    engine = _engine([keep, drained], {"a": 0, "b": 0, "c": 0, "d": 1, "e": 1})
    stopped: list[int] = []
    monkeypatch.setattr(engine._pool, "stop", lambda rep: stopped.append(rep.id))
    monkeypatch.setattr(scaling, "recreate", _fake_recreate(fail={"e"}))
    monkeypatch.setattr(engine, "close_session", lambda sid: pytest.fail(f"{sid} closed"))
    scaler = Scaler(scale_down_after_s=1.0, drain_s=2.0)
    for t in (0.0, 1.0):  # 5 sessions want 1 replica of 8: the emptiest drains at t=1
        scaler.step(engine, t)
    assert drained.draining_since == 1.0 and keep.draining_since is None and not stopped
    scaler.step(engine, 3.0)  # drain_s over: d moves, e's move fails and e stays served
    assert engine._sessions["d"].replica == 0 and engine._sessions["e"].replica == 1
    assert ("close_session", "r-d") in drained.handle.calls  # the old copy, after the move
    assert not any(call[1] == "r-e" for call in drained.handle.calls)
    assert keep.pending == 0 and not stopped
    monkeypatch.setattr(scaling, "recreate", _fake_recreate(fail=set()))
    scaler.step(engine, 4.0)  # e moves now; the replica is empty
    scaler.step(engine, 4.5)  # ... and is stopped
    assert stopped == [1] and 1 not in engine._replicas
    assert sorted(keep.sessions) == ["a", "b", "c", "d", "e"]
