"""Failover: the sessions of a replica that died (or hung) re-created on a surviving one from
their journals, under the same public id, frame indices continuing (:func:`recreate`, also
how a drained replica's sessions move: ``engine.cluster.scaling``).

Where media leaves from the replica (``RayEngine.media_on_replicas``), the session's peer
connection died with it: the front end is told the transports there are gone because the
session moved (note ``transports: 0, moved``: its viewers are expected back, so it is neither
paused nor its recording stopped), the new replica is sent the ``recovered`` event to give
the page over its new connection (the page makes one with a new offer when its media stops),
and frames the front end needs itself (a recording, a WebSocket viewer, a journal that
re-caches) are asked for again.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from typing import TYPE_CHECKING

from worldstream.engine.cluster.placement import Replica, RoutedSession
from worldstream.engine.core.api import Event, SessionClosedError

if TYPE_CHECKING:
    from worldstream.engine.cluster.routing import Router

log = logging.getLogger("worldstream.engine.cluster")

#: the longest a re-creation may take on the surviving replica, s
RECREATE_TIMEOUT_S = 120.0


def fail_over(engine: Router, dead: Replica, why: str) -> None:
    """Re-create ``dead``'s sessions elsewhere; a session no replica can take gets an
    ``error`` event (``session_failed``) and is closed. Kills ``dead`` (a hung replica must
    not go on generating)."""
    import ray

    t0 = time.monotonic()
    with engine._lock:
        if not dead.alive:  # the pump and the monitor may both notice
            return
        dead.alive = False
        moved = [(sid, engine._sessions[sid]) for sid in dead.sessions if sid in engine._sessions]
        dead.sessions = set()
    log.warning("engine replica %d (pid %s on %s) failed (%s): moving %d session(s)", dead.id,
                dead.info.get("pid"), dead.host, why, len(moved))
    with contextlib.suppress(Exception):
        ray.kill(dead.handle)
    for sid, routed in moved:
        if engine.media_on_replicas:
            engine._notify(sid, {"kind": "transports", "n": 0, "moved": True})
        target = engine._pool.place(exclude=dead.id, avoid_host=dead.host)
        if target is None and len(engine._pool.live()) < engine.max_replicas + 1:
            target = engine._pool.launch()  # a replacement (allowed one over the maximum)
            try:
                engine._pool.await_ready(target, engine._pump)
            except RuntimeError:
                target = None
        if target is None:
            _give_up(engine, sid, routed, "its engine replica died and no other has room")
            continue
        try:
            payload = recreate(engine, sid, routed, dead, target)
        except Exception as err:
            _give_up(engine, sid, routed, f"recovery failed: {err!r}")
            continue
        if payload is not None:
            log.warning("session %s recovered on replica %d (%s) %.2f s after its replica "
                        "failed", sid, target.id, target.host, time.monotonic() - t0)


def recreate(engine: Router, sid: str, routed: RoutedSession, source: Replica,
             target: Replica) -> dict | None:
    """Re-create session ``sid`` of ``source`` on ``target`` from its journal and route it
    there (frame indices continuing), then tell it ``recovered``: the event's payload, or
    None when the session was closed meanwhile. Raises what the creation raises (nothing
    changed then). The caller closes or kills the copy on ``source``."""
    import ray

    journal = routed.journal
    info = ray.get(target.handle.create_session.remote(
        journal.prompt, journal.seed, journal.fps, journal.history()),
        timeout=RECREATE_TIMEOUT_S)
    for command in journal.replay():
        target.handle.submit.remote(info.session_id, command)
    if journal.paused:
        target.handle.set_paused.remote(info.session_id, True)
    with engine._lock:
        closed_meanwhile = sid not in engine._sessions
        if not closed_meanwhile:
            engine._by_remote.pop((source.id, routed.remote_id), None)
            routed.replica, routed.remote_id = target.id, info.session_id
            # next_index: after the newest frame the front end forwarded or the old replica's
            # transports reported (pull ``indices``); the new replica's transports get this
            # offset with each offer (``media_calls``), so one index sequence either way. A
            # replica's report is up to one pull old: number on past what it could have sent
            # since (a gap in the indices, never an index the client saw twice)
            unreported = (math.ceil((journal.fps or 30) * (engine._pull_s + 0.1)) + 1
                          if engine.media_on_replicas else 0)
            routed.index_offset = routed.next_index + unreported
            routed.forwarding = not engine.media_on_replicas  # as a new replica starts
            engine._by_remote[(target.id, info.session_id)] = sid
            target.sessions.add(sid)
            source.sessions.discard(sid)
            target.failovers += 1
    if closed_meanwhile:  # a DELETE came while it was being re-created
        target.handle.close_session.remote(info.session_id)
        return None
    payload = {"replica": target.id, "from_replica": source.id,
               "context_frames": len(journal.frames), "host": target.host}
    if engine.media_on_replicas:
        target.handle.post_event.remote(info.session_id, "recovered", payload)
        engine._sync_forwarding(sid)
    routed.events.put(Event("recovered", payload))
    return payload


def _give_up(engine: Router, sid: str, routed, message: str) -> None:
    routed.events.put(Event("error", {"code": "session_failed", "message": message}))
    log.warning("session %s lost: %s", sid, message)
    with contextlib.suppress(SessionClosedError):  # the user may have closed it
        engine.close_session(sid)
