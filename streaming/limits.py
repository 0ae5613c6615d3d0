"""Per-server limits on sessions and per-session limits on client traffic."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from worldstream.streaming.framelog import FRAME_LOG_FRAMES


@dataclass(frozen=True)
class Limits:
    """Per-server limits on sessions and per-session or per-client limits on traffic (the line
    under each field is its doc). Message size and prompt length are schema limits
    (``streaming.messages``)."""

    max_sessions: int = 4
    """Live sessions before ``POST /api/sessions`` answers 503."""
    messages_per_s: float = 30.0
    """Control messages per second per session (a token bucket; key presses come at ~10/s)."""
    message_burst: int = 60
    """That bucket's size."""
    idle_timeout_s: float = 120.0
    """A session with no client message or authenticated request for this long is closed."""
    retry_after_s: float = 5.0
    """What a 503 tells the client to wait, s."""
    frame_log_frames: int = FRAME_LOG_FRAMES
    """Frame records kept per session for the latency lab (``streaming.framelog``)."""
    detached_grace_s: float = 15.0
    """A session with no open transport is paused at once and closed after this long, s."""
    recording_keep_s: float = 900.0
    """A closed session's recording stays downloadable this long, s."""
    peer_connections_per_session: int = 2
    """WebRTC peer connections a session may hold, pending or connected (more: 429)."""
    offer_connect_timeout_s: float = 15.0
    """A peer connection not connected by then is closed (its UDP sockets freed), s."""
    sessions_per_client: int | None = None
    """Sessions one client address may hold (None: no limit; on loopback every client has one
    address)."""
    auth_failures_per_s: float = 2.0
    """Failed authentications per second per client address before 429 (a token bucket)."""
    auth_failure_burst: int = 20
    """That bucket's size."""
    creations_per_s: float = 2.0
    """Session creations per second per client address (each costs a prompt encoding and a
    state)."""
    creation_burst: int = 20
    """That bucket's size."""
    websockets_per_session: int = 2
    """Open WebSocket connections a session may hold (more: 429)."""
    websockets_per_client: int | None = None
    """Open WebSocket connections one client address may hold over all its sessions, those
    still closing included (more: 429; None: ``max_sessions * websockets_per_session``)."""
    uploads_per_session: int = 1
    """Uploads (save point, picture, story) a session may have in flight, read or being
    loaded (more: 429)."""
    upload_budget_bytes: int = 48 * 2**20
    """Bytes of uploads held in all at once, counted as they arrive (``app.bodies``): the
    server's memory over idle that uploads may take. Past it: 503 and Retry-After; one upload
    larger than it: 413."""

    def __post_init__(self) -> None:
        for name in ("max_sessions", "message_burst", "frame_log_frames",
                     "peer_connections_per_session", "auth_failure_burst", "creation_burst",
                     "websockets_per_session", "uploads_per_session", "upload_budget_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("sessions_per_client", "websockets_per_client"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1 or None, got {getattr(self, name)}")
        for name in ("messages_per_s", "idle_timeout_s", "detached_grace_s", "recording_keep_s",
                     "offer_connect_timeout_s", "auth_failures_per_s", "retry_after_s",
                     "creations_per_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")


def websockets_per_client(limits: Limits) -> int:
    """The WebSocket connections one client address may hold (``Limits.websockets_per_client``
    or its default)."""
    if limits.websockets_per_client is not None:
        return limits.websockets_per_client
    return limits.max_sessions * limits.websockets_per_session


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


class ClientBuckets:
    """A token bucket per client address: ``burst`` events, then ``per_s`` a second. Counts
    failed authentications (then 429 to the requests that fail) and session creations.
    Remembers the ``max_clients`` most recent addresses (an attacker rotating addresses cannot
    grow it without bound)."""

    def __init__(self, per_s: float, burst: int, max_clients: int = 4096,
                 clock: Callable[[], float] = time.monotonic):
        self._per_s, self._burst, self._max, self._clock = per_s, burst, max_clients, clock
        self._buckets: OrderedDict[str, RateLimiter] = OrderedDict()

    def _bucket(self, client: str) -> RateLimiter:
        bucket = self._buckets.pop(client, None) or RateLimiter(self._per_s, self._burst,
                                                                self._clock)
        self._buckets[client] = bucket
        while len(self._buckets) > self._max:
            self._buckets.popitem(last=False)
        return bucket

    def empty(self, client: str) -> bool:
        """Whether ``client`` has no event left (peeks: takes nothing)."""
        bucket = self._buckets.get(client)
        return bucket is not None and bucket.tokens() < 1.0

    def take(self, client: str) -> None:
        """Count one event of ``client``."""
        self._bucket(client).allow()
