"""Frame pacing on an absolute schedule of the 90 kHz video clock, shared by both transports."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable

from engine.api import Frame, FrameSlot

#: the RTP video clock, Hz
VIDEO_CLOCK_HZ = 90_000
#: how often an empty slot is looked at again, s (polling never blocks the event loop)
POLL_S = 0.004


class SlotClosedError(RuntimeError):
    """The slot was closed (session ended) while waiting for a frame."""


class Pacer:
    """Takes frames from ``slot`` (oldest first; the slot is bounded and drops its oldest, so
    delay stays under its length) at most ``fps`` per second.

    The first take skips to the newest frame held: frames generated before the client was
    ready (negotiation) would otherwise stay queued ahead of every later frame, a standing
    delay of up to the slot's length. ``skipped`` counts them.

    pts 0 is the first frame; frame tick n is due at ``start + n / fps`` (absolute, so waiting
    errors never add up); when the engine stalls, the ticks missed are skipped instead of being
    caught up in a burst. ``next()`` returns ``(frame, pts)`` with pts on the 90 kHz clock.
    """

    def __init__(self, slot: FrameSlot, fps: int, clock: Callable[[], float] = time.monotonic):
        if fps < 1:
            raise ValueError(f"fps must be >= 1, got {fps}")
        self.slot, self.fps, self._clock = slot, fps, clock
        self._start: float | None = None
        self._next_tick = 0
        self.skipped = 0

    def pts_of_tick(self, tick: int) -> int:
        return round(tick * VIDEO_CLOCK_HZ / self.fps)

    async def _take(self, is_live: Callable[[], bool]) -> Frame:
        while True:
            frame = self.slot.get_nowait()
            if frame is not None:
                return frame
            if self.slot.closed or not is_live():
                raise SlotClosedError("the session's frame slot is closed")
            await asyncio.sleep(POLL_S)

    async def next(self, is_live: Callable[[], bool] = lambda: True) -> tuple[Frame, int]:
        """Wait for the next tick and frame; raises SlotClosedError when the slot closes."""
        if self._start is not None:
            delay = self._start + self._next_tick / self.fps - self._clock()
            if delay > 0:
                await asyncio.sleep(delay)
        frame = await self._take(is_live)
        now = self._clock()
        if self._start is None:
            while (newer := self.slot.get_nowait()) is not None:
                frame = newer
                self.skipped += 1
            self._start = now
        tick = max(self._next_tick, math.floor((now - self._start) * self.fps + 1e-6))
        self._next_tick = tick + 1
        return frame, self.pts_of_tick(tick)
