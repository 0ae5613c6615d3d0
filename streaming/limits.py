"""Per-server limits on sessions and per-session limits on client traffic."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from worldstream.streaming.framelog import FRAME_LOG_FRAMES


@dataclass(frozen=True)
class Limits:
    """``max_sessions``: live sessions before ``POST /api/sessions`` answers 503.
    ``messages_per_s`` / ``message_burst``: token bucket of control messages per session
    (key presses come at ~10/s, the page's pings at 1/s). ``idle_timeout_s``: a session with no
    client message or authenticated request for this long is closed. ``retry_after_s``: what a
    503 tells the client to wait. ``frame_log_frames``: frame records kept per session for the
    latency lab (``streaming.framelog``). Message size and prompt length are schema limits
    (``streaming.messages``).

    Resources a client can hold: ``detached_grace_s``: a session with no open
    transport (never connected, or its tab crashed without a DELETE) is paused at once and
    closed after this long. ``recording_keep_s``: a closed session's recording stays
    downloadable this long. ``peer_connections_per_session``: WebRTC peer connections a session
    may hold (pending or connected; more: 429); ``offer_connect_timeout_s``: a peer connection
    not connected by then is closed (its UDP sockets freed). ``sessions_per_client``: sessions
    one client address may hold (None: no limit; on loopback every client has one address).
    ``auth_failures_per_s`` / ``auth_failure_burst``: token bucket of failed authentications
    per client address (then 429). ``creations_per_s`` / ``creation_burst``: the same for
    session creations (each costs the engine a prompt encoding and a state).
    ``websockets_per_session``: open WebSocket connections a session may hold (more: 429)."""

    max_sessions: int = 4
    messages_per_s: float = 30.0
    message_burst: int = 60
    idle_timeout_s: float = 120.0
    retry_after_s: float = 5.0
    frame_log_frames: int = FRAME_LOG_FRAMES
    detached_grace_s: float = 15.0
    recording_keep_s: float = 900.0
    peer_connections_per_session: int = 2
    offer_connect_timeout_s: float = 15.0
    sessions_per_client: int | None = None
    auth_failures_per_s: float = 2.0
    auth_failure_burst: int = 20
    creations_per_s: float = 2.0
    creation_burst: int = 20
    websockets_per_session: int = 2

    def __post_init__(self) -> None:
        for name in ("max_sessions", "message_burst", "frame_log_frames",
                     "peer_connections_per_session", "auth_failure_burst", "creation_burst",
                     "websockets_per_session"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.sessions_per_client is not None and self.sessions_per_client < 1:
            raise ValueError(f"sessions_per_client must be >= 1 or None, "
                             f"got {self.sessions_per_client}")
        for name in ("messages_per_s", "idle_timeout_s", "detached_grace_s", "recording_keep_s",
                     "offer_connect_timeout_s", "auth_failures_per_s", "retry_after_s",
                     "creations_per_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")


class RateLimiter:
    """Token bucket: ``burst`` tokens, refilled at ``rate`` per second; ``allow()`` takes one."""

    def __init__(self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic):
        self._rate, self._burst, self._clock = rate, float(burst), clock
        self._tokens = float(burst)
        self._last = clock()

    def tokens(self) -> float:
        """Tokens available now (refills; takes none)."""
        now = self._clock()
        self._tokens = min(self._burst, self._tokens + (now - self._last) * self._rate)
        self._last = now
        return self._tokens

    def allow(self) -> bool:
        if self.tokens() >= 1.0:
            self._tokens -= 1.0
            return True
        return False
