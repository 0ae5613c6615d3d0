"""Frame pacing by the engine's playout clock, shared by both transports and the recorder.

There is one clock: the engine stamps every frame with the time its session's playout clock
shows it (``Frame.present_ns``, ``time.perf_counter_ns``); a transport sends each frame at that
time and stamps it with the same time on the 90 kHz video clock. A settings or degradation fps
change therefore reaches the viewer and the recording without a second model of the viewer.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from worldstream.engine.core.api import Frame, FrameSlot

#: the RTP video clock, Hz
VIDEO_CLOCK_HZ = 90_000
#: how often an empty slot is looked at again, s (polling never blocks the event loop; the slot
#: is filled from the engine thread)
POLL_S = 0.002
#: the longest sleep before a frame is due (a closed slot is noticed within it), s
MAX_WAIT_S = 0.05


class SlotClosedError(RuntimeError):
    """The slot was closed (session ended) while waiting for a frame."""


def pts_of(present_ns: int, origin_ns: int) -> int:
    """``present_ns`` on the 90 kHz video clock, counted from ``origin_ns``."""
    return round((present_ns - origin_ns) * VIDEO_CLOCK_HZ / 1_000_000_000)


class Pacer:
    """Hands out the frames of ``slot`` at their presentation time, latest wins.

    ``next()`` waits until the oldest frame held is due (``present_ns``), then returns the
    newest due frame: frames a slow consumer (a WebSocket reader without credit, an event loop
    blocked by a GC pause) did not take in time are dropped, never queued, so a backlog drains
    at once instead of standing. The frame's pts is its presentation time on the 90 kHz clock
    from the first frame handed out (pts 0), strictly increasing: an engine stall is a gap in
    pts, a faster or slower fps is a smaller or larger step.

    ``clock`` returns ``perf_counter_ns``-compatible nanoseconds (a fake clock in tests).
    """

    def __init__(self, slot: FrameSlot, clock: Callable[[], int] = time.perf_counter_ns):
        self.slot, self._clock = slot, clock
        self._origin_ns: int | None = None
        self._last_pts = -1

    async def _take(self, is_live: Callable[[], bool]) -> Frame:
        while True:
            frame, next_ns = self.slot.take_due(self._clock())
            if frame is not None:
                return frame
            if self.slot.closed or not is_live():
                raise SlotClosedError("the session's frame slot is closed")
            if next_ns is None:  # empty: poll for the engine's next frame
                await asyncio.sleep(POLL_S)
            else:  # the oldest frame held is not due yet: sleep until it is (close checked)
                await asyncio.sleep(min(max(next_ns - self._clock(), 0) / 1e9, MAX_WAIT_S))

    async def next(self, is_live: Callable[[], bool] = lambda: True) -> tuple[Frame, int]:
        """The next due frame and its pts; raises SlotClosedError when the slot closes."""
        frame = await self._take(is_live)
        present = frame.present_ns or self._clock()
        if self._origin_ns is None:
            self._origin_ns = present
        pts = max(pts_of(present, self._origin_ns), self._last_pts + 1)
        self._last_pts = pts
        return frame, pts

    @property
    def stale(self) -> int:
        """Frames dropped because a newer one was already due when they were taken."""
        return self.slot.stale
