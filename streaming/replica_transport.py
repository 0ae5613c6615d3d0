"""The front end's WebRTC transport when media leaves from the replicas' hosts
(``streaming.replica_media``): the same ``answer``/``close_all`` as
:class:`~streaming.webrtc.WebRTCTransport`, but the peer connection is the session's
replica's. This process relays the offer and the answer and keeps its session table in step
with what the replica's transport reports (notes): transports opened and closed (pause, the
detached grace, reaping), activity (the idle reaper), recording asks (recordings stay here)."""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

from aiortc import RTCSessionDescription

from worldstream.engine.core.api import SessionClosedError
from worldstream.streaming.sessions import SessionManager, StreamSession
from worldstream.streaming.webrtc import TooManyPeerConnectionsError

log = logging.getLogger("worldstream.streaming")


class ReplicaWebRTC:
    """Answers offers through the session's replica (``engine.media_answer``) and applies its
    notes (set as ``engine.note_handler``). ``manager.engine``: a ``RayEngine`` with media
    on the replicas."""

    def __init__(self, manager: SessionManager):
        self.manager = manager
        self._transports: dict[str, int] = {}  # open transports at the replica, per session
        # transports of a session that moved (failover), still counted as attached until
        # its viewers reconnect or the detached grace runs out
        self._held: dict[str, int] = {}
        self._lock = threading.Lock()
        manager.engine.note_handler = self.on_note  # type: ignore[attr-defined]

    def peer_connections(self, session: StreamSession) -> int:
        return self._transports.get(session.session_id, 0)

    async def answer(self, session: StreamSession, sdp: str) -> RTCSessionDescription:
        """The replica's answer to ``sdp``. Raises ValueError (a bad offer), TooManyPeer-
        ConnectionsError, SessionClosedError, TimeoutError (no live replica answered: the
        session is being moved, or its replica is stuck; offer again)."""
        engine: Any = self.manager.engine
        reply = await asyncio.to_thread(engine.media_answer, session.session_id, sdp)
        error = reply.get("error")
        if error is None:
            return RTCSessionDescription(sdp=reply["sdp"], type=reply["type"])
        message = reply.get("message", "")
        if error == "TooManyPeerConnectionsError":
            raise TooManyPeerConnectionsError(message)
        if error == "SessionClosedError":
            raise SessionClosedError(session.session_id)
        if error == "TimeoutError":  # the replica's media loop is slow or stuck: offer again
            raise TimeoutError(message or "the replica did not answer in time")
        raise ValueError(message)

    async def websocket_url(self, session: StreamSession, origins: tuple[str, ...]) -> str:
        """The URL of the session's WebSocket fallback on its replica's host, open to the
        session's token from pages of ``origins``. Raises SessionClosedError, TimeoutError
        (the session is being moved: ask again), OSError (the replica has no port for it)."""
        engine: Any = self.manager.engine
        reply = await asyncio.to_thread(engine.media_websocket, session.session_id,
                                        session.token, origins)
        error = reply.get("error")
        if error is None:
            return reply["url"]
        if error == "SessionClosedError":
            raise SessionClosedError(session.session_id)
        raise OSError(f"the replica cannot serve a WebSocket: {reply.get('message', error)}")

    def on_note(self, session_id: str, note: dict) -> None:
        """One note of the session's replica (called on its pump thread)."""
        session = next((s for s in self.manager.sessions() if s.session_id == session_id),
                       None)
        if session is None:
            return
        kind = note.get("kind")
        if kind == "transports":
            self._transports_now(session, int(note.get("n", 0)), bool(note.get("moved")))
        elif kind == "active":
            self.manager.touch(session)
        elif kind == "record":
            if note.get("on"):
                self.manager.start_recording(session)
            else:
                self.manager.stop_recording(session)
        else:
            log.warning("unknown note %r from session %s's replica", kind, session_id)

    def _transports_now(self, session: StreamSession, now: int, moved: bool) -> None:
        """Attach/detach the front end's session by the difference to ``now`` open transports
        at the replica (a pause, the detached grace, the recording stop follow from it).

        NOTE: a failover (``moved``) is not a detach: the viewers come back within seconds
        with new offers, and a detach would pause the session on its new replica and stop
        its recording (one continuous file is the point). The count is held until they do,
        or until ``limits.detached_grace_s`` passes without one."""
        sid = session.session_id
        with self._lock:
            before = self._transports.get(sid)
            if before is None:  # first seen: forgotten when the session closes
                before = 0
                self.manager.add_closer(session, lambda: self._forget(sid))
            if moved:
                self._held[sid] = self._held.get(sid, 0) + before
                self._transports[sid] = 0
                timer = threading.Timer(self.manager.limits.detached_grace_s,
                                        self._release, (session,))
                timer.daemon = True
                timer.start()
                return
            before += self._held.pop(sid, 0)
            self._transports[sid] = now
        for _ in range(now - before):
            self.manager.attach(session)
        for _ in range(before - now):
            self.manager.detach(session)

    def _release(self, session: StreamSession) -> None:
        """The viewers of a moved session did not come back: detach what was held."""
        with self._lock:
            held = self._held.pop(session.session_id, 0)
        for _ in range(held):
            self.manager.detach(session)

    def _forget(self, session_id: str) -> None:
        with self._lock:
            self._transports.pop(session_id, None)
            self._held.pop(session_id, None)

    async def close_all(self) -> None:
        """Nothing held here: each peer closes with its session on its replica."""
        with self._lock:
            self._transports.clear()
            self._held.clear()
