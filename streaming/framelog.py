"""Per-session frame log for the latency lab: one record per frame handed to a transport
(engine stage times, send queue, frame index, RTP timestamp, action, ready and send times), in a
bounded ring, served as ``GET /api/sessions/{id}/frames.json``
(``streaming/PROTOCOL_EXTENSIONS.md``)."""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from worldstream.engine.core.api import Frame

#: frames kept per session by default: about 4 minutes at 16 fps, ~1.3 MB of JSON
FRAME_LOG_FRAMES = 4096


class FrameLog:
    """Thread-safe ring of the last ``capacity`` frame records of one session.

    A record (all times in ms)::

        {"index": int, "chunk_index": int, "rtp_ts": int, "action_seq": int,
         "action_t": float | None, "prompt_version": int, "stages_ms": {str: float},
         "queue_ms": float | None, "t_ready_ms": float | None, "t_sent_ms": float}

    ``stages_ms``: the engine's stage times of the frame's chunk (as in the ``frame`` message);
    ``queue_ms``: frame ready in the engine -> handed to the transport; ``t_sent_ms``: wall
    clock (``time.time()``, the clock of ``pong.server_t``) when handed to the transport;
    ``t_ready_ms = t_sent_ms - queue_ms`` on the same clock. A frame sent on two connections of
    one session is logged twice (same ``index``, each connection's ``rtp_ts``).
    """

    def __init__(self, capacity: int = FRAME_LOG_FRAMES):
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._records: deque[dict[str, Any]] = deque(maxlen=capacity)
        self._lock = threading.Lock()
        self.logged = 0

    def record(self, frame: Frame, rtp_ts: int, queue_ms: float | None) -> dict[str, Any]:
        """Log ``frame`` as handed to a transport with pts ``rtp_ts``; returns the record."""
        sent_ms = time.time() * 1000
        entry = {"index": frame.index, "chunk_index": frame.chunk_index, "rtp_ts": rtp_ts,
                 "action_seq": frame.action_seq, "action_t": frame.action_t_ms,
                 "prompt_version": frame.prompt_version, "stages_ms": dict(frame.stages_ms),
                 "queue_ms": queue_ms,
                 "t_ready_ms": None if queue_ms is None else sent_ms - queue_ms,
                 "t_sent_ms": sent_ms}
        with self._lock:
            self._records.append(entry)
            self.logged += 1
        return entry

    def snapshot(self) -> dict[str, Any]:
        """``{"capacity", "logged" (ever), "evicted", "frames": [records, oldest first]}``."""
        with self._lock:
            frames, logged = list(self._records), self.logged
        return {"capacity": self.capacity, "logged": logged, "evicted": logged - len(frames),
                "frames": frames}
