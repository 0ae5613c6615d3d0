"""Stream sessions: the transport-side view of an engine session (token, limits, recorder,
telemetry, open connections) and the manager that admits, authenticates and reaps them."""

from __future__ import annotations

import contextlib
import hmac
import os
import secrets
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from worldstream.engine.core.api import CapacityError, EngineAPI, SessionClosedError, SessionInfo
from worldstream.streaming.framelog import FrameLog
from worldstream.streaming.limits import Limits, RateLimiter, websockets_per_client
from worldstream.streaming.recording import Recorder
from worldstream.streaming.telemetry import StreamTelemetry

#: temporary recording folders are named ``worldstream-rec-<pid>-<random>``: a folder whose
#: process is gone is swept at the next start
REC_DIR_PREFIX = "worldstream-rec-"


def sweep_stale_recording_dirs(root: str | Path | None = None) -> list[Path]:
    """Remove recording folders under ``root`` (default: the temp dir) left by processes that
    no longer run (a crash or a kill skips the clean stop). Returns the removed folders."""
    removed = []
    for path in Path(root or tempfile.gettempdir()).glob(f"{REC_DIR_PREFIX}*-*"):
        pid = path.name[len(REC_DIR_PREFIX):].split("-", 1)[0]
        if not pid.isdigit() or not path.is_dir() or _process_alive(int(pid)):
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


@dataclass
class _KeptRecording:
    """The recording of a closed session, downloadable with its token until ``expires``."""

    token: str
    path: Path
    expires: float


def token_matches(presented: str | None, secret: str) -> bool:
    """Whether ``presented`` is ``secret`` (constant time, ``hmac.compare_digest``); False for
    a missing one."""
    return bool(presented) and hmac.compare_digest(presented.encode(), secret.encode())


def _check_token(presented: str | None, token: str) -> None:
    """BadTokenError unless ``presented`` is ``token`` (constant time)."""
    if not token_matches(presented, token):
        raise BadTokenError("missing or wrong bearer token")


def _refuse_closed(session: StreamSession) -> None:
    if session.closed:
        raise SessionClosedError(session.session_id)


class UnknownSessionError(KeyError):
    """No live session has this id (HTTP 404)."""


class BadTokenError(PermissionError):
    """Missing or wrong bearer token (HTTP 401)."""


@dataclass
class StreamSession:
    """One client's session. ``token``: the secret that steering and reading need.
    ``framelog``: every frame handed to a transport (latency lab, ``frames.json``).
    ``closers``: callbacks run once when the session closes (registered through
    :meth:`SessionManager.add_closer`, which refuses a closed session)."""

    info: SessionInfo
    token: str
    rate: RateLimiter
    last_active: float
    telemetry: StreamTelemetry = field(default_factory=StreamTelemetry)
    framelog: FrameLog = field(default_factory=FrameLog)
    recorder: Recorder | None = None
    recording_path: Path | None = None
    closers: list[Callable[[], Any]] = field(default_factory=list)
    client: str | None = None
    transports: int = 0  # open transports: WebSocket connections, connected peer connections
    websockets: int = 0  # open WebSocket connections (capped: limits.websockets_per_session)
    detached_since: float | None = None  # when the last transport went (or creation)
    closed: bool = False  # set once by SessionManager.close: nothing attaches any more

    @property
    def session_id(self) -> str:
        return self.info.session_id


class SessionManager:
    """Admits sessions up to ``limits.max_sessions`` (and the engine's own capacity), checks
    tokens in constant time, closes idle sessions. Thread-safe.

    NOTE: a request authenticated a moment ago may find its session closed after any await (a
    DELETE, the reaper). So whatever holds a resource for a session registers it here
    (:meth:`add_closer`, :meth:`attach`, :meth:`start_recording`), which refuses a closed
    session with SessionClosedError (HTTP 404); :meth:`close` marks the session and takes its
    closers under the lock that :meth:`add_closer` takes: a resource is either refused or
    released by the close, never left behind."""

    def __init__(self, engine: EngineAPI, limits: Limits, recording_dir: str | Path | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.engine, self.limits, self._clock = engine, limits, clock
        self._own_recording_dir = recording_dir is None
        if self._own_recording_dir:
            sweep_stale_recording_dirs()
            recording_dir = tempfile.mkdtemp(prefix=f"{REC_DIR_PREFIX}{os.getpid()}-")
        self._recording_dir = Path(recording_dir)
        self._sessions: dict[str, StreamSession] = {}
        self._kept: dict[str, _KeptRecording] = {}
        self._creating: list[str | None] = []  # clients of creations under way
        self._websockets: dict[str, int] = {}  # open WebSocket connections per client address
        self._lock = threading.Lock()

    @property
    def capacity(self) -> int:
        return min(self.limits.max_sessions, self.engine.capacity)

    def __len__(self) -> int:
        with self._lock:
            return len(self._sessions)

    def sessions(self) -> list[StreamSession]:
        with self._lock:
            return list(self._sessions.values())

    def create(self, prompt: str, seed: int | None = None, fps: int | None = None,
               client: str | None = None) -> StreamSession:
        """Start an engine session for ``client`` (its address); raises CapacityError when the
        server or the client's share is full, ValueError on bad input. The session is paused
        until a transport attaches (:meth:`attach`)."""
        limits = self.limits
        with self._lock:
            if len(self._sessions) + len(self._creating) >= limits.max_sessions:
                raise CapacityError(f"all {limits.max_sessions} sessions are in use",
                                    limits.retry_after_s)
            if limits.sessions_per_client is not None and client is not None and sum(
                    c == client for c in [s.client for s in self._sessions.values()]
                    + self._creating) >= limits.sessions_per_client:
                raise CapacityError(f"this client already holds {limits.sessions_per_client} "
                                    "sessions; close one first", limits.retry_after_s)
            self._creating.append(client)
        # NOTE: outside the lock: the engine may encode the prompt or ask a remote replica,
        # and every request's authentication takes this lock
        try:
            info = self.engine.create_session(prompt, seed=seed, fps=fps)
        finally:
            with self._lock:
                self._creating.remove(client)
        with self._lock:
            now = self._clock()
            session = StreamSession(
                info=info, token=secrets.token_urlsafe(24),
                rate=RateLimiter(limits.messages_per_s, limits.message_burst, self._clock),
                last_active=now, framelog=FrameLog(limits.frame_log_frames), client=client,
                detached_since=now)
            self._sessions[info.session_id] = session
        self._pause(session, True)
        return session

    def _pause(self, session: StreamSession, paused: bool) -> None:
        with contextlib.suppress(SessionClosedError):
            self.engine.set_paused(session.session_id, paused)

    def add_closer(self, session: StreamSession, closer: Callable[[], Any]) -> None:
        """Run ``closer`` when ``session`` closes; SessionClosedError if it already has."""
        with self._lock:
            _refuse_closed(session)
            session.closers.append(closer)

    def remove_closer(self, session: StreamSession, closer: Callable[[], Any]) -> None:
        with self._lock, contextlib.suppress(ValueError):
            session.closers.remove(closer)

    def open_websocket(self, client: str) -> bool:
        """Count a WebSocket of ``client`` (its address) opening; False (nothing counted) when
        the address holds ``websockets_per_client`` already. :meth:`close_websocket` undoes."""
        with self._lock:
            if self._websockets.get(client, 0) >= websockets_per_client(self.limits):
                return False
            self._websockets[client] = self._websockets.get(client, 0) + 1
            return True

    def close_websocket(self, client: str) -> None:
        with self._lock:
            left = self._websockets.pop(client, 0) - 1
            if left > 0:
                self._websockets[client] = left

    def attach(self, session: StreamSession) -> None:
        """A transport of ``session`` opened: generation runs while at least one is open.
        SessionClosedError if the session has closed."""
        with self._lock:
            _refuse_closed(session)
            session.transports += 1
            first = session.transports == 1
            session.detached_since = None
        if first:
            self._pause(session, False)

    def detach(self, session: StreamSession) -> None:
        """A transport of ``session`` went. With none left the session pauses (no frames for
        nobody), its recording stops (the file stays downloadable) and it is closed after
        ``limits.detached_grace_s`` unless a transport attaches again."""
        with self._lock:
            session.transports = max(session.transports - 1, 0)
            last = session.transports == 0
            if last:
                session.detached_since = self._clock()
        if last:
            self._pause(session, True)
            self.stop_recording(session)

    def authenticate(self, session_id: str, token: str | None) -> StreamSession:
        """The session if ``token`` is its token (also marks it active); raises
        UnknownSessionError, BadTokenError."""
        with self._lock:
            session = self._sessions.get(session_id)
        if session is None:
            raise UnknownSessionError(session_id)
        _check_token(token, session.token)
        self.touch(session)
        return session

    def with_token(self, token: str | None) -> StreamSession | None:
        """The live session whose token ``token`` is (constant-time comparisons), or None."""
        found = None
        for session in self.sessions():
            if token_matches(token, session.token):
                found = session
        return found

    def touch(self, session: StreamSession) -> None:
        session.last_active = self._clock()

    def start_recording(self, session: StreamSession) -> Path:
        """Start (or restart) recording ``session`` to a fresh MP4; returns its path.
        SessionClosedError if the session has closed."""
        _refuse_closed(session)
        self.stop_recording(session)
        path = self._recording_dir / f"{session.session_id}.mp4"
        slot = self.engine.subscribe(session.session_id, maxlen=32)
        session.recorder = Recorder(slot, path, session.info.fps).start()
        session.recording_path = path
        return path

    def stop_recording(self, session: StreamSession) -> Path | None:
        if session.recorder is not None:
            session.recorder.stop()
            session.recorder = None
        return session.recording_path

    def kept_recording(self, session_id: str, token: str | None) -> Path:
        """The recording of a closed session, kept for ``limits.recording_keep_s``, if
        ``token`` was its token. Raises UnknownSessionError (no kept recording of that id),
        BadTokenError."""
        with self._lock:
            kept = self._kept.get(session_id)
        if kept is None:
            raise UnknownSessionError(session_id)
        _check_token(token, kept.token)
        return kept.path

    def close(self, session_id: str) -> None:
        """Close the session, its transports and its recorder; its recording stays
        downloadable for ``limits.recording_keep_s``. Idempotent."""
        with self._lock:
            session = self._sessions.pop(session_id, None)
            if session is None:
                return
            session.closed = True
            closers, session.closers = session.closers, []
        self.stop_recording(session)
        if session.recording_path is not None and session.recording_path.exists():
            with self._lock:
                self._kept[session_id] = _KeptRecording(
                    session.token, session.recording_path,
                    self._clock() + self.limits.recording_keep_s)
        for closer in closers:
            closer()
        with contextlib.suppress(SessionClosedError):  # the engine may have ended it first
            self.engine.close_session(session_id)

    def reap_idle(self) -> list[str]:
        """Close every session idle for over ``limits.idle_timeout_s`` or without a transport
        for over ``limits.detached_grace_s``; delete kept recordings past their time. Returns
        the closed sessions' ids."""
        now, limits = self._clock(), self.limits
        gone = [s.session_id for s in self.sessions()
                if now - s.last_active > limits.idle_timeout_s
                or (s.detached_since is not None
                    and now - s.detached_since > limits.detached_grace_s)]
        for session_id in gone:
            self.close(session_id)
        with self._lock:
            expired = [sid for sid, k in self._kept.items() if k.expires <= now]
            paths = [self._kept.pop(sid).path for sid in expired]
        for path in paths:
            path.unlink(missing_ok=True)
        return gone

    def close_all(self) -> None:
        """Close every session and delete every recording (the server stops: nobody can
        download them any more); a temporary recording folder is removed."""
        for session in self.sessions():
            self.close(session.session_id)
        with self._lock:
            paths = [k.path for k in self._kept.values()]
            self._kept.clear()
        for path in paths:
            path.unlink(missing_ok=True)
        if self._own_recording_dir:
            shutil.rmtree(self._recording_dir, ignore_errors=True)
