"""Stream sessions: the transport-side view of an engine session (token, limits, recorder,
telemetry, open connections) and the manager that admits, authenticates and reaps them."""

from __future__ import annotations

import contextlib
import hmac
import secrets
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.api import CapacityError, EngineAPI, SessionClosedError, SessionInfo
from streaming.framelog import FrameLog
from streaming.limits import Limits, RateLimiter
from streaming.recording import Recorder
from streaming.telemetry import StreamTelemetry


class UnknownSessionError(KeyError):
    """No live session has this id (HTTP 404)."""


class BadTokenError(PermissionError):
    """Missing or wrong bearer token (HTTP 401)."""


@dataclass
class StreamSession:
    """One client's session. ``token``: the secret that steering and reading need.
    ``framelog``: every frame handed to a transport (latency lab, ``frames.json``).
    ``closers``: callbacks run once when the session closes (transports register theirs)."""

    info: SessionInfo
    token: str
    rate: RateLimiter
    last_active: float
    telemetry: StreamTelemetry = field(default_factory=StreamTelemetry)
    framelog: FrameLog = field(default_factory=FrameLog)
    recorder: Recorder | None = None
    recording_path: Path | None = None
    closers: list[Callable[[], Any]] = field(default_factory=list)

    @property
    def session_id(self) -> str:
        return self.info.session_id


class SessionManager:
    """Admits sessions up to ``limits.max_sessions`` (and the engine's own capacity), checks
    tokens in constant time, closes idle sessions. Thread-safe."""

    def __init__(self, engine: EngineAPI, limits: Limits, recording_dir: str | Path | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.engine, self.limits, self._clock = engine, limits, clock
        self._recording_dir = Path(recording_dir or tempfile.mkdtemp(prefix="worldstream-rec-"))
        self._sessions: dict[str, StreamSession] = {}
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

    def create(self, prompt: str, seed: int | None = None, fps: int | None = None) -> StreamSession:
        """Start an engine session; raises CapacityError when full, ValueError on bad input."""
        with self._lock:
            if len(self._sessions) >= self.limits.max_sessions:
                raise CapacityError(f"all {self.limits.max_sessions} sessions are in use",
                                    self.limits.retry_after_s)
            info = self.engine.create_session(prompt, seed=seed, fps=fps)
            session = StreamSession(
                info=info, token=secrets.token_urlsafe(24),
                rate=RateLimiter(self.limits.messages_per_s, self.limits.message_burst,
                                 self._clock),
                last_active=self._clock(), framelog=FrameLog(self.limits.frame_log_frames))
            self._sessions[info.session_id] = session
            return session

    def authenticate(self, session_id: str, token: str | None) -> StreamSession:
        """The session if ``token`` is its token (also marks it active); raises
        UnknownSessionError, BadTokenError."""
        with self._lock:
            session = self._sessions.get(session_id)
        if session is None:
            raise UnknownSessionError(session_id)
        if not token or not hmac.compare_digest(token.encode(), session.token.encode()):
            raise BadTokenError("missing or wrong bearer token")
        self.touch(session)
        return session

    def touch(self, session: StreamSession) -> None:
        session.last_active = self._clock()

    def start_recording(self, session: StreamSession) -> Path:
        """Start (or restart) recording ``session`` to a fresh MP4; returns its path."""
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

    def close(self, session_id: str) -> None:
        """Close the session, its transports and its recorder. Idempotent."""
        with self._lock:
            session = self._sessions.pop(session_id, None)
        if session is None:
            return
        self.stop_recording(session)
        if session.recording_path is not None:
            session.recording_path.unlink(missing_ok=True)
        for closer in session.closers:
            closer()
        with contextlib.suppress(SessionClosedError):  # the engine may have ended it first
            self.engine.close_session(session_id)

    def reap_idle(self) -> list[str]:
        """Close every session idle for over ``limits.idle_timeout_s``; returns their ids."""
        now = self._clock()
        idle = [s.session_id for s in self.sessions()
                if now - s.last_active > self.limits.idle_timeout_s]
        for session_id in idle:
            self.close(session_id)
        return idle

    def close_all(self) -> None:
        for session in self.sessions():
            self.close(session.session_id)
