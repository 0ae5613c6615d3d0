"""Per-server limits on sessions and per-session limits on client traffic."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from streaming.framelog import FRAME_LOG_FRAMES


@dataclass(frozen=True)
class Limits:
    """``max_sessions``: live sessions before ``POST /api/sessions`` answers 503.
    ``messages_per_s`` / ``message_burst``: token bucket of control messages per session
    (key presses come at ~10/s, the page's pings at 1/s). ``idle_timeout_s``: a session with no
    client message or authenticated request for this long is closed. ``retry_after_s``: what a
    503 tells the client to wait. ``frame_log_frames``: frame records kept per session for the
    latency lab (``streaming.framelog``). Message size and prompt length are schema limits
    (``streaming.messages``)."""

    max_sessions: int = 4
    messages_per_s: float = 30.0
    message_burst: int = 60
    idle_timeout_s: float = 120.0
    retry_after_s: float = 5.0
    frame_log_frames: int = FRAME_LOG_FRAMES

    def __post_init__(self) -> None:
        if self.max_sessions < 1:
            raise ValueError(f"max_sessions must be >= 1, got {self.max_sessions}")
        if self.messages_per_s <= 0 or self.message_burst < 1:
            raise ValueError("messages_per_s must be > 0 and message_burst >= 1")
        if self.idle_timeout_s <= 0:
            raise ValueError(f"idle_timeout_s must be > 0, got {self.idle_timeout_s}")
        if self.frame_log_frames < 1:
            raise ValueError(f"frame_log_frames must be >= 1, got {self.frame_log_frames}")


class RateLimiter:
    """Token bucket: ``burst`` tokens, refilled at ``rate`` per second; ``allow()`` takes one."""

    def __init__(self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic):
        self._rate, self._burst, self._clock = rate, float(burst), clock
        self._tokens = float(burst)
        self._last = clock()

    def allow(self) -> bool:
        now = self._clock()
        self._tokens = min(self._burst, self._tokens + (now - self._last) * self._rate)
        self._last = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        return False
