"""Media from the host that generates it: an engine replica that also answers its sessions'
WebRTC offers, so their video (and control data channel) leave from the replica's host.

NOTE: why. With the front end sending every session's media, every frame crosses Ray to it
and is encoded there: at 832x480 a software VP8 encode costs milliseconds of CPU per frame per
viewer, so the front end's cores bound the cluster however many GPUs stand behind it. Here
the replica, which already holds the frames, encodes and sends them from its own host's
address (its ICE candidates are that address only); the front end keeps the page, the API,
placement and signalling: it relays the offer and the answer (``RayEngine.media_answer``) and
nothing per frame. The control data channel rides in the same peer connection, so steering
goes straight to the replica too; what the front end must still know travels back with the
replica's pulls as notes (``ReplicaSessions``): commands for its failover journal,
transports opened and closed (pause, reaping), activity, recording asks. Recordings stay the
front end's (a host loss must not lose one): a recorded session's frames go there as before.

On a failover the peer connection dies with its replica; the client makes a new offer to the
same session (the front end answers it from the new replica, waiting for the failover if it
is still under way), and that connection's data channel carries the ``recovered`` event.

The WebSocket fallback leaves from here too (``streaming.replica_websocket``): the front end
tells the page the replica's URL (``media_websocket``) and the page falls back to the front
end's own route when it cannot reach it; on a failover it asks again and reconnects.

Reuses the front end's pieces as they are: :class:`~streaming.webrtc.WebRTCTransport` (paced
track, limits on peers, early frame messages) and :class:`~streaming.control.ControlChannel`
over a :class:`~streaming.sessions.SessionManager` whose engine is this replica's, addressed
by the sessions' public ids (:class:`PublicIds`).
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from worldstream.engine.cluster.replica import EngineReplica
from worldstream.engine.core.api import Command, Frame, FrameSlot, SessionClosedError, SessionInfo
from worldstream.engine.core.config import EngineConfig
from worldstream.streaming.framelog import FrameLog
from worldstream.streaming.limits import Limits, RateLimiter
from worldstream.streaming.sessions import SessionManager, StreamSession

#: how often at most a session's activity is reported to the front end (its idle reaper
#: closes a session after ``Limits.idle_timeout_s``, 120 s by default), s
ACTIVE_NOTE_S = 10.0
#: the longest an offer may take to answer here, s
ANSWER_TIMEOUT_S = 20.0


class StampedSlot(FrameSlot):
    """A local transport's slot: frames under their public index, the replica's own plus the
    session's ``offset`` (its frames on the replicas it lived on before a failover), so the
    index numbers on as the front end numbers the frames it forwards (``routed.index_offset``,
    the same offset); each index is told to ``seen`` as the engine thread delivers the chunk,
    so the front end learns how far the stream got before the client can show it."""

    def __init__(self, maxlen: int, offset: int, seen: Callable[[int], None]):
        super().__init__(maxlen)
        self._offset, self._seen = offset, seen

    def put(self, frame: Frame) -> None:
        if self._offset:
            frame = replace(frame, index=frame.index + self._offset)
        self._seen(frame.index + 1)
        super().put(frame)


class PublicIds:
    """This replica's engine as a ``SessionManager`` and ``ControlChannel`` see it: sessions
    by their public id (the front end's, kept across failovers); commands also noted for the
    front end's journal; events from the replica's local copy."""

    def __init__(self, replica: EngineReplica):
        self._replica = replica
        self._ids: dict[str, str] = {}
        self._offsets: dict[str, int] = {}  # public id -> its frame index offset here
        self._stamped: dict[str, int] = {}  # remote id -> next public index, since last pull
        self._stamp_lock = threading.Lock()  # the engine thread stamps, the pull takes
        self.capacity = replica.engine.capacity
        self.model_name = replica.engine.model_name
        self.wire_keys = replica.engine.wire_keys

    def map(self, public_id: str, remote_id: str, index_offset: int = 0) -> None:
        self._ids[public_id] = remote_id
        self._offsets[public_id] = index_offset

    def remote(self, public_id: str) -> str:
        try:
            return self._ids[public_id]
        except KeyError:
            raise SessionClosedError(public_id) from None

    def subscribe(self, session_id: str, maxlen: int | None = None) -> FrameSlot:
        remote, engine = self.remote(session_id), self._replica.engine
        slot = StampedSlot(engine.config.slot_maxlen if maxlen is None else maxlen,
                           self._offsets.get(session_id, 0), lambda n: self._stamp(remote, n))
        return engine.subscribe(remote, slot=slot)

    def _stamp(self, remote_id: str, next_index: int) -> None:
        with self._stamp_lock:
            self._stamped[remote_id] = max(next_index, self._stamped.get(remote_id, 0))

    def stamped(self) -> dict[str, int]:
        """Remote id -> the public index after the newest frame handed to a transport here,
        for the sessions that had one since the last call (``EngineReplica.pull``)."""
        with self._stamp_lock:
            out, self._stamped = self._stamped, {}
        return out

    def submit(self, session_id: str, command: Command) -> None:
        remote = self.remote(session_id)
        self._replica.submit(remote, command)  # ValueError: refused, as on the front end
        self._replica.note(remote, {"kind": "command", "command": command})

    def events(self, session_id: str):
        return self._replica.local_events(self.remote(session_id))

    def latency_budget(self, session_id: str) -> dict[str, Any]:
        return self._replica.engine.latency_budget(self.remote(session_id))

    def set_paused(self, session_id: str, paused: bool) -> None:
        self._replica.set_paused(self.remote(session_id), paused)

    def close_session(self, session_id: str) -> None:
        """Forget the id: the front end closes the engine session (``close_session``)."""
        self._ids.pop(session_id, None)
        self._offsets.pop(session_id, None)


class ReplicaSessions(SessionManager):
    """The replica's sessions as its transports see them: attached, paused and reaped as on
    the front end, with every change the front end needs sent as a note (``transports`` n,
    ``active``, ``record`` on/off). Recording itself is the front end's."""

    def __init__(self, ids: PublicIds, limits: Limits, replica: EngineReplica):
        # recordings are never written here: the folder is only named
        super().__init__(ids, limits, recording_dir=tempfile.gettempdir())  # type: ignore[arg-type]
        self._replica, self._ids = replica, ids
        self._noted_active: dict[str, float] = {}

    def adopt(self, public_id: str, remote_id: str, info: SessionInfo,
              index_offset: int = 0) -> StreamSession:
        """The session ``public_id`` (engine session ``remote_id`` here, its frame indices
        numbered from ``index_offset``), made on its first offer."""
        if index_offset < 0:
            raise ValueError(f"index_offset must be >= 0, got {index_offset}")
        with self._lock:
            found = self._sessions.get(public_id)
            if found is not None:
                return found
            self._ids.map(public_id, remote_id, index_offset)
            now = self._clock()
            limits = self.limits
            session = StreamSession(
                info=info, token="", last_active=now, detached_since=now,
                rate=RateLimiter(limits.messages_per_s, limits.message_burst, self._clock),
                framelog=FrameLog(limits.frame_log_frames))
            self._sessions[public_id] = session
        return session

    def _note(self, session: StreamSession, payload: dict) -> None:
        with contextlib.suppress(SessionClosedError):
            self._replica.note(self._ids.remote(session.session_id), payload)

    def touch(self, session: StreamSession) -> None:
        super().touch(session)
        now = time.monotonic()
        if now - self._noted_active.get(session.session_id, -1e9) >= ACTIVE_NOTE_S:
            self._noted_active[session.session_id] = now
            self._note(session, {"kind": "active"})

    def attach(self, session: StreamSession) -> None:
        super().attach(session)
        self._note(session, {"kind": "transports", "n": session.transports})

    def detach(self, session: StreamSession) -> None:
        super().detach(session)
        self._note(session, {"kind": "transports", "n": session.transports})

    def start_recording(self, session: StreamSession) -> Path:
        if session.closed:
            raise SessionClosedError(session.session_id)
        self._note(session, {"kind": "record", "on": True})
        session.recording_path = Path(f"{session.session_id}.mp4")  # the front end's file
        return session.recording_path

    def stop_recording(self, session: StreamSession) -> Path | None:
        if session.recording_path is not None:
            self._note(session, {"kind": "record", "on": False})
        return session.recording_path


class MediaServer:
    """An asyncio loop thread with the replica's WebRTC transport, ICE bound to ``address``
    (this host's address in the cluster: media leaves from here, nowhere else)."""

    def __init__(self, replica: EngineReplica, limits: Limits, address: str | None):
        from worldstream.streaming.webrtc import (
            WebRTCTransport,
            bind_media,
            configure_ice_consent,
            configure_vp8_bitrate,
            vp8_bitrate,
        )

        backend = replica.engine.backend
        bind_media(address)
        configure_ice_consent()
        configure_vp8_bitrate(vp8_bitrate(backend.width, backend.height, backend.default_fps))
        self.ids = PublicIds(replica)
        self.sessions = ReplicaSessions(self.ids, limits, replica)
        self._size = (backend.width, backend.height)
        self._pixel_art = replica.engine.pixel_art
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="replica-media",
                                        daemon=True)
        self._thread.start()
        self.webrtc = WebRTCTransport(self.sessions)
        self._limits, self._address = limits, address
        self._websocket: Any = None  # started on the first ask: most viewers use WebRTC

    def _info(self, public_id: str, fps: int) -> SessionInfo:
        return SessionInfo(public_id, *self._size, fps, pixel_art=self._pixel_art)

    def websocket_url(self, remote_id: str, public_id: str, token: str,
                      origins: tuple[str, ...], fps: int, index_offset: int = 0) -> str:
        """The URL of the session's WebSocket here, open to ``token`` from pages of
        ``origins`` (``ReplicaWebSocketServer.admit``); raises OSError, ValueError."""
        from worldstream.streaming.replica_websocket import ReplicaWebSocketServer

        if self._websocket is None:
            self._websocket = ReplicaWebSocketServer(self.sessions, self._limits,
                                                     self._address, self.loop)
        self.sessions.adopt(public_id, remote_id, self._info(public_id, fps), index_offset)
        return self._websocket.admit(public_id, token, origins)

    def answer(self, remote_id: str, public_id: str, sdp: str, fps: int,
               index_offset: int = 0) -> Any:
        """The answer to ``sdp`` for the session; raises as ``WebRTCTransport.answer``."""
        session = self.sessions.adopt(public_id, remote_id, self._info(public_id, fps),
                                      index_offset)
        return asyncio.run_coroutine_threadsafe(self.webrtc.answer(session, sdp),
                                                self.loop).result(ANSWER_TIMEOUT_S)

    def close(self, remote_id: str) -> None:
        """Close the transports of the session held here as ``remote_id``."""
        for session in self.sessions.sessions():
            with contextlib.suppress(SessionClosedError):
                if self.ids.remote(session.session_id) == remote_id:
                    self.sessions.close(session.session_id)
                    if self._websocket is not None:
                        self._websocket.forget(session.session_id)

    def stop(self) -> None:
        if self._websocket is not None:
            self._websocket.stop()
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self.webrtc.close_all(), self.loop).result(5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)


class MediaReplica(EngineReplica):
    """An :class:`~engine.cluster.replica.EngineReplica` whose sessions' media leave from its
    own host (``RayEngine(replica_cls=MediaReplica)``). Frames go to the front end only when
    it asks (``forward_frames``). ``limits``: the per-session limits of its transports (peer
    connections, message rates), as the front end's. ``media_host``: the address its media
    (WebRTC, the WebSocket fallback) listen on: the front end's bind address in a cluster of
    this host alone; None: this host's address in the Ray cluster."""

    serves_media = True

    def __init__(self, model: str, config: EngineConfig, model_kwargs: dict | None = None,
                 threads: int | None = None, limits: Limits | None = None,
                 media_host: str | None = None):
        super().__init__(model, config, model_kwargs, threads, forward_all=False)
        self._limits = limits or Limits()
        self._media_host = media_host
        self._media: MediaServer | None = None
        self._media_lock = threading.Lock()

    def media_answer(self, remote_id: str, public_id: str, sdp: str,
                     index_offset: int = 0) -> dict:
        """``{"sdp", "type"}`` answering a client's offer for session ``remote_id`` (public
        id ``public_id``; its frames numbered from ``index_offset``: the front end's
        ``routed.index_offset``, so indices carry on after a failover), or the refusal as data
        ``{"error": class name, "message"}`` (``ValueError``: a bad offer;
        ``TooManyPeerConnectionsError``; ``SessionClosedError``)."""
        try:
            media = self._media_server()
            fps = self.engine.latency_budget(remote_id)["fps"]
            answer = media.answer(remote_id, public_id, sdp, fps, index_offset)
            return {"sdp": answer.sdp, "type": answer.type}
        except Exception as err:  # the caller's answer, not the actor's death
            return {"error": type(err).__name__, "message": str(err)}

    def media_websocket(self, remote_id: str, public_id: str, token: str,
                        origins: tuple[str, ...], index_offset: int = 0) -> dict:
        """``{"url"}``: where the session's WebSocket fallback is served from this host, for
        clients presenting ``token`` (from browser pages of ``origins`` only; frames numbered
        as in :meth:`media_answer`), or the refusal
        as data ``{"error": class name, "message"}`` (``SessionClosedError``; ``OSError``:
        no port here)."""
        try:
            media = self._media_server()
            fps = self.engine.latency_budget(remote_id)["fps"]
            return {"url": media.websocket_url(remote_id, public_id, token, tuple(origins),
                                               fps, index_offset)}
        except Exception as err:  # the caller's answer, not the actor's death
            return {"error": type(err).__name__, "message": str(err)}

    def _media_server(self) -> MediaServer:
        with self._media_lock:  # started on the first ask: aiortc loads only if used
            if self._media is None:
                self._media = MediaServer(self, self._limits,
                                          self._media_host or self.describe()["address"])
            return self._media

    def _stamped(self) -> dict[str, int]:
        media = self._media
        return media.ids.stamped() if media is not None else {}

    def close_session(self, session_id: str) -> None:
        if self._media is not None:
            # the engine's own ``closed`` would reach the local copy of its events only with
            # a pull, after the session is forgotten here: the transports' last message
            self.post_event(session_id, "closed", {})
            self._media.close(session_id)
        super().close_session(session_id)

    def stop(self) -> None:
        if self._media is not None:
            self._media.stop()
        super().stop()
