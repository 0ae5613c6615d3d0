"""The server's slow work (a session's creation, a save point's load, a picture's decode,
a story's check) in a thread pool of its own, bounded: never in asyncio's default pool, which
also encodes every WebSocket frame (``streaming.websocket``).

16 loads of one session once filled the shared 6-thread pool: another user's video froze for
26-37 s and a third user's session creation took 18-29 s.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from worldstream.app.errors import ApiError

T = TypeVar("T")


class SlowWork:
    """``await run(fn)``: ``fn()`` in one of ``workers`` threads; at most ``max_in_flight``
    jobs running or queued (more: 503 with Retry-After at once), each waited for at most
    ``timeout_s`` (then 503; the thread finishes its job unobserved)."""

    def __init__(self, workers: int = 4, max_in_flight: int = 16, timeout_s: float = 120.0,
                 retry_after_s: float = 2.0):
        self.max_in_flight, self.timeout_s = max_in_flight, timeout_s
        self.retry_after_s = retry_after_s
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="slow-work")
        self._lock = threading.Lock()
        self._in_flight = 0

    @property
    def in_flight(self) -> int:
        return self._in_flight

    async def run(self, fn: Callable[[], T], field: str | None = None) -> T:
        with self._lock:
            if self._in_flight >= self.max_in_flight:
                raise self._busy("the server is busy with other loads and creations; retry "
                                 "shortly", field)
            self._in_flight += 1
        future = self._pool.submit(fn)
        future.add_done_callback(self._release)
        try:
            return await asyncio.wait_for(asyncio.wrap_future(future), self.timeout_s)
        except TimeoutError:
            raise self._busy(f"the work did not finish within {self.timeout_s:g} s",
                             field) from None

    def _release(self, _future: Any) -> None:
        with self._lock:
            self._in_flight -= 1

    def _busy(self, message: str, field: str | None) -> ApiError:
        return ApiError(503, message, field, retry_after_s=self.retry_after_s,
                        headers={"Retry-After": str(max(1, round(self.retry_after_s)))})

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
