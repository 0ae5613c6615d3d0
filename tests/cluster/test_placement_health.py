"""Placement across hosts, the rules that tell a hung replica, hosts joining and leaving, and a
Ray address that does not answer (issue 55). Plain data: no Ray started here."""

from __future__ import annotations

import logging
import socket
import time

import pytest

from worldstream.engine.cluster import health
from worldstream.engine.cluster.placement import Replica, place
from worldstream.engine.cluster.pool import check_address


def _rep(i: int, host: str, sessions: int = 0, capacity: int = 4) -> Replica:
    return Replica(i, None, {"capacity": capacity, "address": host},
                   sessions={f"s{i}-{k}" for k in range(sessions)})


def test_a_new_session_goes_to_the_least_loaded_replica_then_the_least_loaded_host():
    a1, a2, b1 = _rep(0, "A", 1), _rep(1, "A", 0), _rep(2, "B", 0)
    # a2 and b1 both hold none; host B holds fewer sessions than A
    assert place([a1, a2, b1]) is b1
    b1.sessions = {"x"}
    assert place([a1, a2, b1]) is a2


def test_a_failover_avoids_the_dead_replicas_host_while_another_has_room():
    dead, same_host, other = _rep(0, "A", 2), _rep(1, "A", 0), _rep(2, "B", 3)
    assert place([same_host, other], exclude=dead.id, avoid_host="A") is other
    other.sessions = {f"x{k}" for k in range(4)}  # full: the same host is better than none
    assert place([same_host, other], exclude=dead.id, avoid_host="A") is same_host
    same_host.sessions = {f"y{k}" for k in range(4)}
    assert place([same_host, other], exclude=dead.id, avoid_host="A") is None


def test_a_replica_that_stops_answering_is_hung_after_the_deadline():
    rep = _rep(0, "A")
    health.note_reply(rep, 100.0)
    assert health.silent(rep, 102.9, hang_after_s=3.0) is None
    assert "no answer for 3.1 s" in health.silent(rep, 103.1, hang_after_s=3.0)


def test_a_replica_that_answers_but_runs_no_chunk_for_waiting_sessions_is_hung():
    rep = _rep(0, "A")
    health.note_reply(rep, 0.0)
    health.note_metrics(rep, {"batches": 10, "unpaused": 2}, 0.0)
    health.note_metrics(rep, {"batches": 10, "unpaused": 2}, 1.0)  # stalled from here
    health.note_reply(rep, 5.0)
    assert "no chunk for 4.0 s" in health.silent(rep, 5.0, hang_after_s=3.0)
    health.note_metrics(rep, {"batches": 11, "unpaused": 2}, 5.5)  # a chunk ran: fine again
    assert health.silent(rep, 5.5, hang_after_s=3.0) is None
    for t in (6.0, 7.0, 20.0):  # paused sessions make no chunks, and that is not a hang
        health.note_metrics(rep, {"batches": 11, "unpaused": 0}, t)
        health.note_reply(rep, t)
    assert health.silent(rep, 20.0, hang_after_s=3.0) is None


def test_hosts_joining_late_and_leaving_are_logged(caplog):
    watch = health.HostWatch()
    with caplog.at_level(logging.INFO, logger="worldstream.engine.cluster"):
        assert watch.update({"198.18.0.1"}) == (set(), set())
        assert watch.update({"198.18.0.1", "198.18.0.2"}) == ({"198.18.0.2"}, set())
        assert watch.update({"198.18.0.1"}) == (set(), {"198.18.0.2"})
    text = caplog.text
    assert "1 host(s): 198.18.0.1" in text
    assert "host 198.18.0.2 joined the Ray cluster" in text
    assert "host 198.18.0.2 left the Ray cluster" in text


def test_a_ray_address_that_does_not_answer_fails_in_seconds_with_what_to_do():
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.monotonic()
    with pytest.raises(ConnectionError, match=rf"127.0.0.1:{port} does not answer.*ray start"):
        check_address(f"127.0.0.1:{port}", timeout_s=2.0)
    assert time.monotonic() - t0 < 3.0
    check_address("auto")  # left to Ray


def test_the_router_refuses_such_an_address_before_starting_anything():
    from worldstream.engine.cluster.router import RayEngine

    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        pytest.skip("a Ray is up in this process")
    with pytest.raises(ConnectionError, match="does not answer"):
        RayEngine("emulated", address="127.0.0.1:9").start()
    assert not ray.is_initialized()


def test_a_slow_models_deadline_is_ten_of_its_chunks():
    rep = _rep(0, "A")
    assert health.deadline_s(rep, 3.0) == 3.0
    rep.metrics = {"chunk_ms_p95": 750.0}  # Wan2.1 at 832x480 on one GPU
    assert health.deadline_s(rep, 3.0) == 7.5
    health.note_reply(rep, 0.0)
    assert health.silent(rep, 5.0, 3.0) is None and health.silent(rep, 8.0, 3.0) is not None
