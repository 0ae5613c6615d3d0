"""Deadline-aware scheduling of chunks: playout clocks, earliest-deadline-first batching and
deliberate degradation. Torch-free bookkeeping on ints and floats; every time is an explicit
``now_ns`` argument (``time.perf_counter_ns`` in the engine, a fake clock in tests).

:class:`Scheduler` owns what the engine's loop asks of it: admission (the one
:class:`StateBudget` of backend states), each session's just-in-time start and the requests
built from the sessions' playout clocks. Each session (and each branch being previewed) offers
at most one :class:`ChunkRequest`: *urgent* from the chunk's just-in-time start (its deadline minus
the planned generation time), *eligible* a few frame intervals before it (``join`` frames).
:func:`plan_batch` starts a batch only for an urgent request and lets every eligible request
with the same ``(chunk_frames, steps)`` join it, so sessions whose clocks are offset fall into
step and share forward passes instead of alternating. After the batch, the engine reports each
chunk's timeliness to the session's :class:`DegradeController`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from worldstream.engine.core.api import CapacityError

if TYPE_CHECKING:  # the session module imports this one for its clock and degradation
    from worldstream.engine.core.config import EngineConfig
    from worldstream.engine.core.session import Session

NS = 1_000_000_000


class PlayoutClock:
    """The presentation clock of one stream: frame ``f`` is on screen at
    ``anchor_ns + (f - anchor_frame) / fps`` seconds.

    The clock starts when the first chunk is ready (time to first frame is not a miss). The
    *playout buffer* is the number of frames generated ahead of the clock; a negative buffer
    means the viewer waited for frames (a stall), after which the clock is re-anchored at the
    stream's end, so late frames are shown late once instead of the delay piling up.
    """

    def __init__(self, fps: float, created_ns: int):
        if fps <= 0:
            raise ValueError(f"fps must be > 0, got {fps}")
        self.fps = fps
        self.started = False
        self.anchor_ns = created_ns
        self.anchor_frame = 0.0  # frames presented at anchor_ns (fractional)

    def presented(self, now_ns: int) -> float:
        """Frames presented by ``now_ns`` (fractional; 0 before the start)."""
        if not self.started:
            return 0.0
        return self.anchor_frame + (now_ns - self.anchor_ns) * self.fps / NS

    def buffer_frames(self, generated: int, now_ns: int) -> float:
        """Frames generated ahead of the clock (negative: the viewer is waiting)."""
        return generated - self.presented(now_ns)

    def time_of_frame(self, frame: float) -> int:
        """``perf_counter_ns`` at which ``frame`` is presented (the creation time before the
        clock starts: the first chunk is wanted at once)."""
        if not self.started:
            return self.anchor_ns
        return self.anchor_ns + round((frame - self.anchor_frame) * NS / self.fps)

    def deadline_ns(self, generated: int) -> int:
        """When the buffer of a stream with ``generated`` frames runs out."""
        return self.time_of_frame(generated)

    def due_at_ns(self, generated: int, chunk_frames: int, max_frames: int) -> int:
        """The earliest time the next chunk keeps the buffer within ``max_frames``."""
        return self.time_of_frame(generated + chunk_frames - max_frames)

    def anchor(self, frame: int, now_ns: int) -> None:
        """Present ``frame`` at ``now_ns`` (starts the clock, or re-anchors it)."""
        self.started = True
        self.anchor_frame = frame
        self.anchor_ns = now_ns

    def set_fps(self, fps: float, now_ns: int) -> None:
        """Change the rate from now on without a jump in the presented position."""
        if fps <= 0:
            raise ValueError(f"fps must be > 0, got {fps}")
        if self.started:
            self.anchor_frame = self.presented(now_ns)
            self.anchor_ns = now_ns
        self.fps = fps


class DegradeController:
    """Degradation levels of one session: level 0 runs the requested steps and fps; each level
    above drops to the next step count (down to ``min_steps``) that costs less than the one
    above it, then multiplies fps by ``factor`` (down to ``min_fps``). ``step_cost``: a chunk's
    relative cost at each step count (the backend's optional ``step_cost``, e.g. forwards per
    chunk); None: cost = steps, so each level drops one step. A step count no cheaper than the
    one above it is skipped: it would slow a late session down, or not speed it up.

    ``record(late)`` is called once per chunk; ``misses`` consecutive late chunks raise the
    level by one, ``recover`` consecutive on-time chunks lower it by one.
    """

    def __init__(
        self,
        steps: int,
        fps: int,
        *,
        min_steps: int,
        min_fps: int,
        factor: float,
        misses: int,
        recover: int,
        step_cost: Callable[[int], float] | None = None,
    ):
        self.min_steps, self.min_fps, self.factor = min_steps, min_fps, factor
        self._cost = step_cost or float
        self.misses, self.recover = misses, recover
        self.level = 0
        self._late_run = 0
        self._on_time_run = 0
        self.set_requested(steps=steps, fps=fps)

    def set_requested(self, steps: int | None = None, fps: int | None = None) -> None:
        """New requested steps/fps (a client setting); the level is clamped to the new range."""
        if steps is not None:
            self.requested_steps = max(steps, self.min_steps)
            ladder = [self.requested_steps]
            for n in range(self.requested_steps - 1, self.min_steps - 1, -1):
                if self._cost(n) < self._cost(ladder[-1]):
                    ladder.append(n)
            self._ladder = ladder  # the step count at each step level
        if fps is not None:
            self.requested_fps = max(fps, self.min_fps)
        self.level = min(self.level, self.max_level)

    @property
    def _step_levels(self) -> int:
        return len(self._ladder) - 1

    @property
    def max_level(self) -> int:
        level = self._step_levels
        while self._fps_at(level) > self.min_fps:
            level += 1
        return level

    def _fps_at(self, level: int) -> int:
        fps_levels = max(level - self._step_levels, 0)
        return max(self.min_fps, round(self.requested_fps * self.factor**fps_levels))

    @property
    def steps(self) -> int:
        return self._ladder[min(self.level, self._step_levels)]

    @property
    def fps(self) -> int:
        return self._fps_at(self.level)

    @property
    def degraded(self) -> bool:
        return self.level > 0

    def record(self, late: bool) -> int:
        """Account one chunk; returns the level change (+1 degraded, -1 recovered, 0)."""
        if late:
            self._late_run += 1
            self._on_time_run = 0
            if self._late_run >= self.misses and self.level < self.max_level:
                self.level += 1
                self._late_run = 0
                return 1
        else:
            self._on_time_run += 1
            self._late_run = 0
            if self._on_time_run >= self.recover and self.level > 0:
                self.level -= 1
                self._on_time_run = 0
                return -1
        return 0


@dataclass(frozen=True)
class ChunkRequest:
    """One due chunk of a session's stream (``branch`` None) or of a branch being previewed.
    ``session``: the session itself (the batch carries it to the runner; anything with a
    ``session_id`` in tests)."""

    session: Any
    branch: int | None
    chunk_frames: int
    steps: int
    deadline_ns: int
    start_ns: int  # planned start (just in time); the chunk's "queue" stage is measured from it
    urgent: bool = True

    @property
    def batch_key(self) -> tuple[int, int]:
        return (self.chunk_frames, self.steps)


@dataclass
class BatchPlan:
    """Requests generated together in one ``backend.generate`` call, most urgent first."""

    chunk_frames: int
    steps: int
    requests: list[ChunkRequest] = field(default_factory=list)


def _urgency(request: ChunkRequest) -> tuple:
    # ties go to the stream (branch None) before its previews, then by id for determinism
    return (request.deadline_ns, request.branch is not None, request.session.session_id,
            request.branch or 0)


def _may_join(head: ChunkRequest, request: ChunkRequest) -> bool:
    """Streams join a stream's batch early (batching is cheaper than two calls); a preview
    joins one only when urgent (one waiting for slack would lengthen the batch). A preview's
    batch takes only previews: a stream pulled into it would be generated ahead, on older
    keys, which adds a frame interval to its action-to-photon latency."""
    if head.branch is not None:
        return request.branch is not None
    return request.branch is None or request.urgent


def plan_batch(requests: list[ChunkRequest], max_batch: int) -> BatchPlan | None:
    """Earliest deadline first: the urgent request with the earliest deadline fixes
    ``(chunk_frames, steps)``; the other eligible requests with that key join in deadline
    order, up to ``max_batch`` (see :func:`_may_join`). None when no request is urgent.
    Requests left out stay eligible and are planned next time."""
    if max_batch < 1:
        raise ValueError(f"max_batch must be >= 1, got {max_batch}")
    urgent = [r for r in requests if r.urgent]
    if not urgent:
        return None
    head = min(urgent, key=_urgency)
    joiners = sorted((r for r in requests if r.batch_key == head.batch_key and r is not head
                      and _may_join(head, r)), key=_urgency)
    return BatchPlan(chunk_frames=head.chunk_frames, steps=head.steps,
                     requests=[head, *joiners[: max_batch - 1]])


class StateBudget:
    """Backend states (sessions + fork branches) live at once, against the backend's
    ``max_states``: the one count of them (the backends keep none). Not thread-safe by
    itself: the engine calls it under its lock."""

    def __init__(self, max_states: int):
        if max_states < 1:
            raise ValueError(f"max_states must be >= 1, got {max_states}")
        self.max_states = max_states
        self.live = 0

    def can_reserve(self, n: int = 1) -> bool:
        return self.live + n <= self.max_states

    def account(self, session: Session, delta: int) -> None:
        """Count ``delta`` states more (or fewer, negative) for ``session``."""
        session.num_states += delta
        self.live += delta

    def release_all(self, session: Session) -> None:
        """Return every state ``session`` holds (reservations included). Idempotent."""
        self.live -= session.num_states
        session.num_states = 0


class Scheduler:
    """Admission and planning for the engine's loop, on the sessions' own clocks.

    Args:
        config: the engine's settings (``max_sessions``, ``max_batch``, ``jit_margin_ms``,
            ``buffer_max_frames``, ``batch_join_frames``, ``preview_max_wait_ms``,
            ``retry_after_s``).
        max_states: the backend's state budget (``WorldBackend.max_states``).
    Not thread-safe by itself: the engine holds its lock around :meth:`admit` and budget
    changes (other threads' ``metrics()`` read the sessions, clocks and budget).
    """

    def __init__(self, config: EngineConfig, max_states: int):
        self.config = config
        self.budget = StateBudget(max_states)

    def admit(self, num_sessions: int) -> None:
        """Reserve one state for a new session (call with the lock held). CapacityError when
        ``max_sessions`` sessions are live or the state budget is spent."""
        cfg = self.config
        if num_sessions >= cfg.max_sessions:
            raise CapacityError(f"all {cfg.max_sessions} sessions are in use", cfg.retry_after_s)
        if not self.budget.can_reserve(1):
            raise CapacityError(f"the model's memory holds {self.budget.max_states} "
                                "states and all are in use", cfg.retry_after_s)
        self.budget.live += 1

    def plan_ms(self, s: Session) -> float:
        """The generation time a chunk of ``s`` is planned with, ms: the p95 of its recent
        chunks (a whole chunk's duration before 3 are measured) plus ``jit_margin_ms``."""
        chunk_ms = 1e3 * s.chunk_frames / s.clock.fps
        return s.stats.gen_estimate_ms(chunk_ms) + self.config.jit_margin_ms

    def start_at(self, s: Session) -> int:
        """Just in time: the ``perf_counter_ns`` at which the session's next chunk starts so
        that it is ready when its first frame is due (deadline minus :meth:`plan_ms`), never
        earlier than ``buffer_max_frames`` allows. Before the clock starts: at once."""
        if not s.clock.started:
            return s.clock.anchor_ns
        start = s.clock.deadline_ns(s.frame_index) - round(self.plan_ms(s) * 1e6)
        earliest = s.clock.due_at_ns(s.frame_index, s.chunk_frames, self.config.buffer_max_frames)
        return max(start, earliest)

    def requests(self, live: list[Session], now_ns: int) -> list[ChunkRequest]:
        """Every eligible chunk of the ``live`` sessions: streams whose chunk starts now
        (urgent) or within ``batch_join_frames`` frame intervals (may join a batch started for
        another session), branches awaiting previews."""
        cfg = self.config
        requests = []
        starts = {s.session_id: self.start_at(s) for s in live}
        next_stream_ns = min(starts.values(), default=None)
        max_wait_ns = round(cfg.preview_max_wait_ms * 1e6)
        for s in live:
            start = starts[s.session_id]
            join_from = start - round(cfg.batch_join_frames * NS / s.clock.fps)
            if join_from <= now_ns:
                requests.append(ChunkRequest(s, None, s.chunk_frames, s.steps,
                                             s.clock.deadline_ns(s.frame_index), start,
                                             urgent=start <= now_ns))
            pending = [(i, b) for i, b in enumerate(s.branches) if b.chunks_left > 0]
            if not pending:
                continue
            # NOTE: previews are one session's extra work: they run in the slack before the
            # next stream chunk is due, or once they have waited preview_max_wait_ms, so a
            # client forking at its rate limit cannot starve the other streams
            chunk_ms = 1e3 * s.chunk_frames / s.clock.fps
            cost_ns = round(s.stats.gen_estimate_ms(chunk_ms) * len(pending) * 1e6)
            fits = next_stream_ns is None or now_ns + cost_ns <= next_stream_ns
            for i, branch in pending:
                requests.append(ChunkRequest(
                    s, i, s.chunk_frames, s.steps, branch.requested_ns, branch.requested_ns,
                    urgent=fits or now_ns - branch.requested_ns >= max_wait_ns))
        return requests

    def next_batch(self, live: list[Session], now_ns: int) -> BatchPlan | None:
        """The batch to generate now (:func:`plan_batch` over :meth:`requests`), or None."""
        return plan_batch(self.requests(live, now_ns), self.config.max_batch)

    def idle_timeout(self, live: list[Session], now_ns: int, max_idle_s: float,
                     preview_poll_ns: int) -> float:
        """Seconds until the next chunk starts (0 when one starts now; at most
        ``max_idle_s``; ``preview_poll_ns`` while previews wait for slack)."""
        wake = now_ns + int(max_idle_s * NS)
        for s in live:
            if any(b.chunks_left > 0 for b in s.branches):
                wake = min(wake, now_ns + preview_poll_ns)  # look again soon, do not spin
            wake = min(wake, self.start_at(s))
        return max(wake - now_ns, 0) / NS
