"""One streaming session as the engine thread sees it: backend state, held action, prompt
version, frame counters, playout clock, degradation, branches, subscribers and statistics.

Only the engine thread mutates a session, except ``subscribers`` (guarded by the engine's
lock). No torch here: ``state`` and branch states are opaque backend objects.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from worldstream.engine.core.api import ActionCommand, Event, EventQueue, Frame, FrameSlot
from worldstream.engine.core.inputlog import InputLog
from worldstream.engine.core.playout import NS, DegradeController, PlayoutClock


@dataclass
class Branch:
    """One alternative future of a fork: its state and the preview frames generated so far."""

    state: Any
    seed: int
    chunks_left: int
    frames: list[np.ndarray] = field(default_factory=list)
    requested_ns: int = 0


class SessionStats:
    """Measured figures of one session over a sliding window (bounded memory)."""

    def __init__(self, window_s: float):
        self.window_ns = int(window_s * NS)
        self.chunks: deque[tuple[int, int]] = deque()  # (t_ready_ns, frames) within the window
        self.gen_ms: deque[float] = deque(maxlen=64)
        self.finish_ms: deque[float] = deque(maxlen=64)  # backend work after delivery
        self.action_to_frame_ms: deque[float] = deque(maxlen=512)
        self.late_frames = 0  # frames the playout clock waited for (stalls), summed
        self.frames = 0

    def add_chunk(self, t_ready_ns: int, num_frames: int, gen_ms: float) -> None:
        self.chunks.append((t_ready_ns, num_frames))
        while self.chunks and self.chunks[0][0] < t_ready_ns - self.window_ns:
            self.chunks.popleft()
        self.gen_ms.append(gen_ms)
        self.frames += num_frames

    def fps(self) -> float:
        """Frames per second over the window: frames after the first chunk / time spanned."""
        if len(self.chunks) < 2:
            return 0.0
        span_ns = self.chunks[-1][0] - self.chunks[0][0]
        frames = sum(n for _, n in list(self.chunks)[1:])
        return frames * NS / span_ns if span_ns > 0 else 0.0

    def gen_estimate_ms(self, default_ms: float, samples: int = 32) -> float:
        """The generation time to plan a chunk with: p95 of the last ``samples`` chunks'
        batch times, ms (``default_ms`` until 3 chunks are measured)."""
        if len(self.gen_ms) < 3:
            return default_ms
        return float(np.percentile(list(self.gen_ms)[-samples:], 95))

    def latency_percentiles(self) -> dict[str, float | None]:
        if not self.action_to_frame_ms:
            return {"p50": None, "p95": None, "count": 0}
        values = np.asarray(self.action_to_frame_ms)
        return {"p50": float(np.percentile(values, 50)), "p95": float(np.percentile(values, 95)),
                "count": int(values.size)}


class Session:
    """A session's engine-side record (created by the engine on ``create_session``)."""

    def __init__(
        self,
        session_id: str,
        prompt: str,
        seed: int,
        *,
        fps: int,
        chunk_frames: int,
        created_ns: int,
        degrade: DegradeController,
        stats_window_s: float,
        idle_action: int,
    ):
        self.session_id = session_id
        self.prompt = prompt
        self.seed = seed
        self.state: Any = None  # the backend state, made on the engine thread
        self.prompt_version = 0
        self.action = idle_action  # the backend's action id for the held keys
        self.keys: frozenset[str] = frozenset()  # the held keys (an action_space's multi-hot)
        self.pointer = (0.0, 0.0)  # mouse motion (px) not yet in a chunk: the next one takes it
        self.action_seq = -1
        self.action_t_ms: float | None = None
        self.pending_actions: list[tuple[int, int]] = []  # (seq, receipt ns) awaiting a frame
        self.frame_index = 0  # frames generated on the stream
        self.chunk_index = 0
        self.chunk_frames = chunk_frames
        self.mode: str | None = None  # engine.core.config.MODES key, None: custom settings
        self.clock = PlayoutClock(fps, created_ns)
        self.degrade = degrade
        self.fork_id = -1
        self.fork_seq = -1
        self.branches: list[Branch] = []
        self.subscribers: list[FrameSlot] = []
        self.events = EventQueue()
        self.stats = SessionStats(stats_window_s)
        self.closed = False
        self.released = False
        self.paused = False  # no chunks while paused (no viewer attached)
        self.num_states = 1  # backend states counted against the budget (reserved at admission)
        self.inputs: InputLog | None = None  # what steered it (core.inputlog), set on admission
        self.script: Any = None  # a story playing (studio.worldio.StoryPlayer), or None

    @property
    def steps(self) -> int:
        return self.degrade.steps

    def apply_action(self, command: ActionCommand, action: int, receipt_ns: int,
                     pointer: tuple[float, float] | None = None) -> bool:
        """Hold ``action`` (the backend's id for ``command.keys``) from the next chunk on, and
        add ``pointer`` (checked ``(dx, dy)``, or None) to the motion the next chunk takes; an
        action older than the newest one applied (reordered in transit) is ignored, its
        pointer too. Returns whether it was applied."""
        if command.seq <= self.action_seq:
            return False
        self.action = action
        self.keys = frozenset(command.keys)
        if pointer is not None:
            self.pointer = (self.pointer[0] + pointer[0], self.pointer[1] + pointer[1])
        self.action_seq = command.seq
        self.action_t_ms = command.t_ms
        self.pending_actions.append((command.seq, receipt_ns))
        return True

    def take_pointer(self) -> tuple[float, float]:
        """The mouse motion summed since the last stream chunk, reset: the next chunk's."""
        pointer, self.pointer = self.pointer, (0.0, 0.0)
        return pointer

    def make_frames(
        self, rgb: np.ndarray, stages_ms: dict[str, float], t_ready_ns: int,
        action_seq: int, action_t_ms: float | None, prompt_version: int,
    ) -> list[Frame]:
        """Frames of the chunk just generated (``rgb``: ``(n, H, W, 3)`` uint8), numbered on
        from the stream's counters, which advance; resolves the action-to-frame latency of
        every pending action the chunk was conditioned on."""
        frames = [
            Frame(session_id=self.session_id, index=self.frame_index + i, rgb=rgb[i],
                  action_seq=action_seq, prompt_version=prompt_version,
                  chunk_index=self.chunk_index, stages_ms=dict(stages_ms),
                  t_ready_ns=t_ready_ns, action_t_ms=action_t_ms,
                  present_ns=self.clock.time_of_frame(self.frame_index + i))
            for i in range(rgb.shape[0])
        ]
        self.frame_index += len(frames)
        self.chunk_index += 1
        still_pending = []
        for seq, receipt_ns in self.pending_actions:
            if seq <= action_seq:
                self.stats.action_to_frame_ms.append((t_ready_ns - receipt_ns) / 1e6)
            else:
                still_pending.append((seq, receipt_ns))
        self.pending_actions = still_pending
        return frames

    def emit(self, kind: str, **payload: Any) -> None:
        self.events.put(Event(kind, payload))
