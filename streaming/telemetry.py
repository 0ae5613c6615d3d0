"""Per-session stream telemetry: frames sent per second, generation ms per chunk, and the
server-side queue latency (frame ready -> handed to the transport), as rolling windows."""

from __future__ import annotations

import threading
import time
from collections import deque

import numpy as np


class StreamTelemetry:
    """Thread-safe rolling statistics over the last ``window`` frames sent."""

    def __init__(self, window: int = 120):
        self._lock = threading.Lock()
        self._sent_s: deque[float] = deque(maxlen=window)   # monotonic send times, s
        self._queue_ms: deque[float] = deque(maxlen=window)
        self._gen_ms: deque[float] = deque(maxlen=32)       # one per chunk
        self._last_chunk: int | None = None
        self.frames_sent = 0

    def record(self, chunk_index: int, stages_ms: dict[str, float], queue_ms: float) -> None:
        with self._lock:
            self._sent_s.append(time.monotonic())
            self._queue_ms.append(queue_ms)
            if chunk_index != self._last_chunk:
                self._last_chunk = chunk_index
                # "queue" is time spent waiting for the engine thread, not generating
                self._gen_ms.append(float(sum(v for k, v in stages_ms.items() if k != "queue")))
            self.frames_sent += 1

    def queue_samples(self) -> list[float]:
        """The queue latencies of the frames in the window, ms."""
        with self._lock:
            return list(self._queue_ms)

    def snapshot(self) -> dict[str, float | None]:
        """``fps`` over the window (0 with < 2 frames), ``gen_ms`` (mean of the recent chunks),
        ``queue_ms_p50``/``queue_ms_p95`` (None before any frame)."""
        with self._lock:
            sent, queue, gen = list(self._sent_s), list(self._queue_ms), list(self._gen_ms)
        fps = 0.0
        if len(sent) >= 2 and sent[-1] > sent[0]:
            fps = (len(sent) - 1) / (sent[-1] - sent[0])
        p50 = p95 = None
        if queue:
            p50, p95 = (float(v) for v in np.percentile(queue, [50, 95]))
        return {"fps": round(fps, 2), "gen_ms": round(float(np.mean(gen)), 2) if gen else None,
                "queue_ms_p50": p50, "queue_ms_p95": p95}
