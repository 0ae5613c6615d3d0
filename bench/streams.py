"""Streaming sessions through the real :class:`engine.core.engine.Engine` thread, as a client would:
create sessions, press keys at random moments, read every frame from a subscriber slot.

What is measured (all ``perf_counter_ns`` on this process's clock):

* time to first frame: ``create_session`` called -> the first frame's ``t_ready_ns``;
* fps per session: frames after the first chunk / time from the first to the last chunk;
* action-to-frame latency: ``submit`` called -> ``t_ready_ns`` of the first frame whose
  ``action_seq`` covers the action (:func:`bench.stats.match_actions`), computed here from the
  frames, independently of the engine's own counters;
* per-stage ms of each chunk (``Frame.stages_ms``: queue, denoise, cache_fill, decode).
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field

import numpy as np

from worldstream.bench.stats import match_actions, summarize
from worldstream.engine.core.api import ActionCommand, CapacityError
from worldstream.engine.core.config import EngineConfig
from worldstream.engine.core.engine import Engine

KEY_SETS = ([], ["up"], ["down"], ["left"], ["right"], ["up", "left"], ["down", "right"])
NS = 1_000_000_000


def game_key_sets(wire_keys: tuple[str, ...] | list[str]) -> list[list[str]]:
    """The held sets a benchmark presses in a game world: none, and each of its keys alone."""
    return [[], *([k] for k in sorted(wire_keys))]


def bench_engine_config(*, fps: int, steps: int, chunk_frames: int | None = None,
                        max_sessions: int = 8, degrade: bool = False) -> EngineConfig:
    """The engine settings of a benchmark stream. ``degrade=False`` (default) turns the
    deliberate degradation off so the numbers describe the stated steps and fps: a stream that
    cannot keep up is re-anchored (late frames counted) and shows its real throughput."""
    kwargs = {}
    if not degrade:
        kwargs = {"degrade_after_misses": 10**9, "min_steps": steps}
    return EngineConfig(max_sessions=max_sessions, fps=fps, max_fps=max(60, fps), steps=steps,
                        chunk_frames=chunk_frames, slot_maxlen=100_000, **kwargs)


@dataclass
class SessionRun:
    """What one session of a run produced (metadata only: pixels are dropped on arrival)."""

    session_id: str
    created_ns: int
    frame_seq: list[int] = field(default_factory=list)
    frame_ns: list[int] = field(default_factory=list)
    stages: list[dict] = field(default_factory=list)  # one per chunk
    action_seq: list[int] = field(default_factory=list)
    action_ns: list[int] = field(default_factory=list)
    chunk_ns: list[int] = field(default_factory=list)
    chunk_frames: list[int] = field(default_factory=list)

    def add(self, frame) -> None:
        self.frame_seq.append(frame.action_seq)
        self.frame_ns.append(frame.t_ready_ns)
        if not self.chunk_ns or self.chunk_ns[-1] != frame.t_ready_ns:
            self.chunk_ns.append(frame.t_ready_ns)
            self.chunk_frames.append(1)
            self.stages.append(dict(frame.stages_ms))
        else:
            self.chunk_frames[-1] += 1

    def latencies_ms(self, since_ns: int | None = None) -> np.ndarray:
        """Action-to-frame ms of every answered action (submitted after ``since_ns``)."""
        lat = match_actions(self.action_seq, self.action_ns, self.frame_seq, self.frame_ns)
        keep = ~np.isnan(lat)
        if since_ns is not None:
            keep &= np.asarray(self.action_ns) >= since_ns
        return lat[keep] / 1e6

    def fps(self, since_ns: int | None = None) -> float:
        """Frames per second between chunks (the first chunk counted as the start)."""
        t = np.asarray(self.chunk_ns)
        n = np.asarray(self.chunk_frames)
        if since_ns is not None:
            keep = t >= since_ns
            t, n = t[keep], n[keep]
        if t.size < 2 or t[-1] == t[0]:
            return 0.0
        return float(n[1:].sum() * NS / (t[-1] - t[0]))

    def steady_fps(self, warmup_s: float = 1.0) -> float:
        """fps after the first ``warmup_s`` of the stream (a paced stream first fills its
        playout buffer in a burst), or over the whole stream when too little follows."""
        if not self.chunk_ns:
            return 0.0
        since = self.chunk_ns[0] + int(warmup_s * NS)
        if sum(t >= since for t in self.chunk_ns) >= 3:
            return self.fps(since_ns=since)
        return self.fps()

    def summary(self) -> dict:
        stage_names = sorted({k for s in self.stages for k in s})
        return {
            "frames": len(self.frame_ns),
            "ttff_ms": (self.frame_ns[0] - self.created_ns) / 1e6 if self.frame_ns else None,
            "fps": self.steady_fps(),
            "actions": len(self.action_seq),
            "action_to_frame_ms": summarize(self.latencies_ms()),
            "stages_ms": {k: summarize([s[k] for s in self.stages if k in s])["p50"]
                          for k in stage_names},
        }


@dataclass
class StreamRun:
    sessions: list[SessionRun]
    refused_at: int | None  # 1-based index of the first session admission refused, if any
    seconds: float
    engine_metrics: dict
    mean_batch_size: float  # chunk jobs per backend call during this run


    def aggregate_fps(self) -> float:
        return sum(s.steady_fps() for s in self.sessions)


def create_session(engine: Engine, prompt: str, seed: int, fps: int | None,
                   wait_s: float = 5.0):
    """``engine.create_session``, retried for up to ``wait_s`` on CapacityError: the engine
    thread returns a closed session's state budget asynchronously, so a session closed just
    before may still hold it. Raises the last CapacityError after ``wait_s``."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return engine.create_session(prompt, seed=seed, fps=fps)
        except CapacityError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.05)


def run_streams(engine: Engine, *, sessions: int = 1, seconds: float = 10.0,
                action_rate_hz: float = 3.0, seed: int = 0, fps: int | None = None,
                prompt: str = "grassy meadow with a river",
                on_tick=None, tick_s: float = 1.0, admission_wait_s: float = 5.0,
                key_sets: list[list[str]] | tuple = KEY_SETS) -> StreamRun:
    """Open ``sessions`` sessions on a started ``engine``, press random keys (a Poisson
    process of ``action_rate_hz`` per session, each a held set drawn from ``key_sets``:
    default the directions; a game world's own keys, :func:`game_key_sets`) for ``seconds``,
    then close them.

    Admission is tried for every session (each retried for ``admission_wait_s``, see
    :func:`create_session`); a refusal stops opening more and is reported as ``refused_at``.
    ``on_tick(elapsed_s, runs)`` is called every ``tick_s`` (the soak suite samples memory
    there). Raises RuntimeError when a session ends with an error.
    """
    rng = random.Random(seed)
    before = engine.metrics()
    runs, slots = [], []
    refused_at = None
    for i in range(sessions):
        t0 = time.perf_counter_ns()
        try:
            info = create_session(engine, prompt, seed + i, fps, admission_wait_s)
        except CapacityError:
            refused_at = i + 1
            break
        runs.append(SessionRun(info.session_id, t0))
        slots.append(engine.subscribe(info.session_id))
    next_action = [time.perf_counter_ns() + int(rng.expovariate(action_rate_hz) * NS)
                   for _ in runs]
    seq = [0] * len(runs)
    start = time.perf_counter_ns()
    end = start + int(seconds * NS)
    next_tick = start + int(tick_s * NS)
    try:
        while (now := time.perf_counter_ns()) < end:
            for i, run in enumerate(runs):
                while (frame := slots[i].get_nowait()) is not None:
                    run.add(frame)
                if now >= next_action[i]:
                    seq[i] += 1
                    t_submit = time.perf_counter_ns()
                    engine.submit(run.session_id, ActionCommand(
                        seq[i], t_submit / 1e6, frozenset(rng.choice(key_sets))))
                    run.action_seq.append(seq[i])
                    run.action_ns.append(t_submit)
                    next_action[i] = t_submit + int(rng.expovariate(action_rate_hz) * NS)
            if on_tick is not None and now >= next_tick:
                on_tick((now - start) / NS, runs)
                next_tick += int(tick_s * NS)
            _check_events(engine, runs)
            time.sleep(0.002)
        metrics = engine.metrics()
    finally:
        for run in runs:
            try:
                engine.close_session(run.session_id)
            except KeyError:
                pass
    for i, run in enumerate(runs):  # frames that were ready before the close
        while (frame := slots[i].get_nowait()) is not None:
            run.add(frame)
    batches = metrics["batches"] - before["batches"]
    jobs = (metrics["batches"] * metrics["mean_batch_size"]
            - before["batches"] * before["mean_batch_size"])
    return StreamRun(runs, refused_at, seconds, metrics, jobs / batches if batches else 0.0)


def measure_ttff(engine: Engine, *, repeats: int = 3, fps: int | None = None,
                 prompt: str = "grassy meadow with a river", timeout_s: float = 30.0) -> dict:
    """Time to first frame of fresh sessions on an otherwise idle engine, one at a time:
    ``create_session`` called -> first frame ``t_ready_ns``. Returns ``summarize`` of the ms.
    Raises TimeoutError when no frame comes within ``timeout_s``."""
    values = []
    for i in range(repeats):
        t0 = time.perf_counter_ns()
        info = create_session(engine, prompt, 1000 + i, fps)
        slot = engine.subscribe(info.session_id)
        try:
            frame = slot.get(timeout=timeout_s)
            if frame is None:
                raise TimeoutError(f"no frame within {timeout_s} s")
            values.append((frame.t_ready_ns - t0) / 1e6)
        finally:
            engine.close_session(info.session_id)
    return summarize(values)


def _check_events(engine: Engine, runs: list[SessionRun]) -> None:
    for run in runs:
        try:
            events = engine.events(run.session_id)
        except KeyError:
            raise RuntimeError(f"session {run.session_id} ended during the benchmark") from None
        while not events.empty():
            event = events.get_nowait()
            if event.kind == "error":
                raise RuntimeError(f"session error: {event.payload}")
