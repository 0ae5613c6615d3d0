"""Deadline-aware scheduling of chunks: earliest-deadline-first batching over the sessions'
playout clocks (:mod:`engine.core.playout`, with their degradation). Torch-free bookkeeping on
ints and floats; every time is an explicit ``now_ns`` argument (``time.perf_counter_ns`` in the
engine, a fake clock in tests).

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

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from worldstream.engine.core.api import CapacityError
from worldstream.engine.core.playout import NS

if TYPE_CHECKING:
    from worldstream.engine.core.config import EngineConfig
    from worldstream.engine.core.session import Session

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
        self.check_admit(num_sessions)
        self.budget.live += 1

    def check_admit(self, num_sessions: int) -> None:
        """:meth:`admit`'s CapacityError, reserving nothing (before slow work a refusal would
        waste)."""
        cfg = self.config
        if num_sessions >= cfg.max_sessions:
            raise CapacityError(f"all {cfg.max_sessions} sessions are in use", cfg.retry_after_s)
        if not self.budget.can_reserve(1):
            raise CapacityError(f"the model's memory holds {self.budget.max_states} "
                                "states and all are in use", cfg.retry_after_s)

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
