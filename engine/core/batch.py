"""Runs one planned batch on the backend (engine thread only): builds the chunk jobs, calls
``backend.generate``, checks the frames, delivers them to the sessions' slots with timeliness
and degradation accounting, collects fork previews and runs the backend's after-delivery work.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

import numpy as np

from worldstream.engine.core.backend import (
    BackendInfo,
    ChunkJob,
    ChunkResult,
    Finishes,
    WorldBackend,
)
from worldstream.engine.core.commands import derived_seed
from worldstream.engine.core.config import EngineConfig
from worldstream.engine.core.scheduler import BatchPlan
from worldstream.engine.core.session import Session


class BatchRunner:
    """Generates and hands out the chunks of each :class:`BatchPlan`.

    Args:
        backend: the world model generating the chunks; info: what it is.
        config: the engine settings (``preview_chunks``).
        lock: the engine's lock (guards clocks, stats, subscribers and the counters here).
        fail: ends one session after a failure, with a message.
    """

    def __init__(self, backend: WorldBackend, info: BackendInfo, config: EngineConfig,
                 lock: threading.Lock, fail: Callable[[Session, str], None]):
        self.backend = backend
        self.config = config
        self._lock = lock
        self._fail = fail
        self.num_batches = 0
        self.num_jobs = 0
        # per-frame action vectors (engine.core.action_space), None for action ids only
        self.action_space = info.action_space

    def run(self, plan: BatchPlan) -> None:
        jobs, meta = [], []
        for req in plan.requests:
            s = req.session
            if s.closed:
                continue
            if req.branch is None:
                if s.script is not None:  # a story's events due by this chunk
                    s.script.play_due(s)
                state, seed = s.state, None
                s.inputs.steps_used(plan.steps, s.chunk_index, s.frame_index)
            else:
                s.inputs.add("preview", s.chunk_index, s.frame_index, branch=req.branch,
                             steps=plan.steps)
                branch = s.branches[req.branch]
                done = self.config.preview_chunks - branch.chunks_left
                state, seed = branch.state, derived_seed(branch.seed, done)
            jobs.append(ChunkJob(state, [s.action] * plan.chunk_frames, plan.steps, seed,
                                 self._controls(s, req.branch is None, plan.chunk_frames)))
            meta.append((s, req, s.action_seq, s.action_t_ms, s.prompt_version, s.fork_id))
        if not jobs:
            return
        t_start = time.perf_counter_ns()
        try:
            results = self.backend.generate(jobs)
            if len(results) != len(jobs):
                raise RuntimeError(f"backend returned {len(results)} results for {len(jobs)} jobs")
        except Exception as exc:  # the whole batch failed: only its sessions end
            results = [ChunkResult(None, error=exc)] * len(jobs)
        t_ready = time.perf_counter_ns()
        gen_ms = (t_ready - t_start) / 1e6
        with self._lock:
            self.num_batches += 1
            self.num_jobs += len(jobs)
        shape = (plan.chunk_frames, self.backend.height, self.backend.width, 3)
        for (s, req, action_seq, action_t_ms, prompt_version, fork_id), res in zip(
            meta, results, strict=True
        ):
            if s.closed or (req.branch is not None and fork_id != s.fork_id):
                continue  # closed, or a branch dropped by adopt/another fork meanwhile
            error = res.error
            if error is None and (res.frames is None or res.frames.shape != shape
                                  or res.frames.dtype != np.uint8):
                got = None if res.frames is None else (res.frames.shape, res.frames.dtype)
                error = ValueError(f"chunk frames {got}, expected {shape} uint8")
            if error is not None:
                self._fail(s, f"chunk generation failed: {error!r}")
                continue
            # "queue": how much later than planned (just in time) the chunk started
            stages = {"queue": max(t_start - req.start_ns, 0) / 1e6, **res.stages_ms}
            if req.branch is None:
                self._deliver(s, res.frames, stages, t_ready, gen_ms,
                              action_seq, action_t_ms, prompt_version)
                for kind, payload in res.events:  # e.g. a game's episode ended
                    s.emit(kind, **payload)
            else:
                self._preview_chunk(s, req.branch, res.frames)
        self._finish([s for s, *_ in meta])

    def _controls(self, s: Session, stream: bool, frames: int) -> list | None:
        """A chunk's per-frame action vectors where the backend declares an action space:
        the held keys, and for a stream chunk the mouse motion summed since the last one
        (taken: a fork preview leaves it to the stream); None otherwise."""
        if self.action_space is None:
            return None
        pointer = s.take_pointer() if stream else (0.0, 0.0)
        return self.action_space.frame_controls(s.keys, pointer, frames)

    def _finish(self, sessions: list[Session]) -> None:
        """The backend's work left for after delivery (optional hook ``finish()``: e.g. the
        built-in model's cache fill), off the action-to-photon path; a failure ends the
        batch's sessions."""
        if not isinstance(self.backend, Finishes):
            return
        try:
            stages = self.backend.finish()
        except Exception as exc:
            for s in sessions:
                if not s.closed:
                    self._fail(s, f"chunk finish failed: {exc!r}")
            return
        with self._lock:
            for s in sessions:
                s.stats.finish_ms.append(sum(stages.values()))

    def _deliver(self, s: Session, rgb: np.ndarray, stages: dict[str, float], t_ready: int,
                 gen_ms: float, action_seq: int, action_t_ms: float | None,
                 prompt_version: int) -> None:
        with self._lock:  # metrics() reads the clock, degradation and stats
            if not s.clock.started:
                s.clock.anchor(0, t_ready)  # time to first frame is not a deadline miss
            else:
                buffer = s.clock.buffer_frames(s.frame_index, t_ready)
                late = buffer < 0
                if late:
                    # the viewer waited: show the new frames from now on instead of catching up
                    s.stats.late_frames += math.ceil(-buffer)
                    s.clock.anchor(s.frame_index, t_ready)
                # NOTE: degradation judges the session's own work: a chunk that was late only
                # because it started late (another session's previews, a command's work) is
                # not this session's fault, and lowering its steps or fps would not help it
                own_miss = late and gen_ms > 1e3 * len(rgb) / s.clock.fps
                change = s.degrade.record(own_miss)
                if change:
                    s.clock.set_fps(s.degrade.fps, t_ready)
                    s.emit("degraded", degraded=s.degrade.degraded, level=s.degrade.level,
                           steps=s.degrade.steps, fps=s.degrade.fps,
                           reason="chunks late" if change > 0 else "kept up again")
            frames = s.make_frames(rgb, stages, t_ready, action_seq, action_t_ms, prompt_version)
            s.stats.add_chunk(t_ready, len(frames), gen_ms)
            # a consumer that went away (connection closed, recording stopped) closed its slot:
            # stop feeding it instead of counting drops for good
            s.subscribers = [slot for slot in s.subscribers if not slot.closed]
            slots = list(s.subscribers)
        for slot in slots:
            for frame in frames:
                slot.put(frame)

    def _preview_chunk(self, s: Session, index: int, rgb: np.ndarray) -> None:
        branch = s.branches[index]
        branch.frames.extend(rgb)
        branch.chunks_left -= 1
        if all(b.chunks_left == 0 for b in s.branches):
            for i, b in enumerate(s.branches):
                s.emit("preview", seq=s.fork_seq, fork_id=s.fork_id, branch=i, frames=b.frames)
