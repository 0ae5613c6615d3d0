"""What comes back from a replica, taken in by the front end: one pump thread per replica
long-polls ``EngineReplica.pull`` and hands frames to the session's local slots (public index
and clock), events to its queue, notes of a replica-side transport to the router's
``note_handler``; and the rule for which sessions' frames the replica sends here at all."""

from __future__ import annotations

import contextlib
import logging
import time
from typing import TYPE_CHECKING

from worldstream.engine.cluster import health
from worldstream.engine.cluster.failover import fail_over
from worldstream.engine.cluster.placement import Replica, RoutedSession
from worldstream.engine.cluster.replies import public_frame
from worldstream.engine.core.api import SessionClosedError

if TYPE_CHECKING:
    from worldstream.engine.cluster.routing import Router

log = logging.getLogger("worldstream.engine.cluster")


def pump(engine: Router, rep: Replica) -> None:
    """Pull ``rep`` until it stops or the engine does; a failed pull fails it over."""
    import ray

    while not engine._stopping.is_set() and rep.alive:
        try:
            reply = ray.get(rep.handle.pull.options(concurrency_group="poll").remote(
                engine._pull_s), timeout=60)
        except Exception as err:  # RayActorError (the process died), a timeout, ...
            if engine._stopping.is_set() or not rep.alive:
                return
            fail_over(engine, rep, repr(err))
            return
        health.note_reply(rep, time.monotonic())
        offset = time.perf_counter_ns() - reply["now_ns"]
        rep.offset_ns = offset if rep.offset_ns is None else min(rep.offset_ns, offset)
        deliver(engine, rep, reply)


def _public(engine: Router, rep: Replica, remote_id: str
            ) -> tuple[str | None, RoutedSession | None]:
    with engine._lock:
        sid = engine._by_remote.get((rep.id, remote_id))
        return sid, engine._sessions.get(sid) if sid else None


def deliver(engine: Router, rep: Replica, reply: dict) -> None:
    """Hand one pull's frames, events, notes and closed sessions to the front end."""
    off = rep.offset_ns or 0
    for frame in reply["frames"]:
        with engine._lock:
            sid = engine._by_remote.get((rep.id, frame.session_id))
            routed = engine._sessions.get(sid) if sid else None
            if sid is None or routed is None:
                continue
            routed.slots = [s for s in routed.slots if not s.closed]
            slots = list(routed.slots)
            index = frame.index + routed.index_offset
            routed.next_index = max(routed.next_index, index + 1)
        routed.journal.record_frame(frame.rgb, frame.action_seq)
        public = public_frame(frame, sid, index, off)
        for slot in slots:
            slot.put(public)
        if not slots and engine.media_on_replicas:
            sync_forwarding(engine, sid)  # nobody here watches any more
    # NOTE: frames that left from the replica's own transports never pass here: their indices
    # are how ``recreate`` knows where a moved session's stream got to (its next offset)
    for remote_id, next_index in reply.get("indices", {}).items():
        _, routed = _public(engine, rep, remote_id)
        if routed is not None:
            with engine._lock:
                routed.next_index = max(routed.next_index, next_index)
    for remote_id, event in reply["events"]:
        _, routed = _public(engine, rep, remote_id)
        if routed is not None and event.kind != "closed":
            routed.events.put(event)
    for remote_id, note in reply.get("notes", ()):
        sid, routed = _public(engine, rep, remote_id)
        if sid is None or routed is None:
            continue
        if note.get("kind") == "command":  # steering that went straight to the replica
            routed.journal.record_command(note["command"])
        else:
            notify(engine, sid, note)
    for remote_id in reply["closed"]:  # ended on the replica (a failure), not by us
        sid, _ = _public(engine, rep, remote_id)
        if sid is not None:
            with contextlib.suppress(SessionClosedError):
                engine.close_session(sid)


def notify(engine: Router, session_id: str, note: dict) -> None:
    """Give ``note`` to the engine's ``note_handler`` (a transport's failure is logged, the
    pump goes on)."""
    handler = engine.note_handler
    if handler is None:
        return
    try:
        handler(session_id, note)
    except Exception as err:
        log.warning("note %s of session %s failed: %r", note.get("kind"), session_id, err)


def sync_forwarding(engine: Router, session_id: str) -> None:
    """Ask the session's replica for its frames exactly while something here uses them: with
    media from the front end always; else a live slot (a recording, a WebSocket viewer) or a
    journal whose backend re-caches recent frames on a failover (``observes``)."""
    with engine._lock:
        routed = engine._sessions.get(session_id)
        rep = engine._replicas.get(routed.replica) if routed else None
        if routed is None or rep is None or not rep.alive:
            return
        want = (not engine.media_on_replicas or bool(rep.info.get("observes"))
                or any(not s.closed for s in routed.slots))
        if want == routed.forwarding:
            return
        routed.forwarding = want
    rep.handle.forward_frames.remote(routed.remote_id, want)
