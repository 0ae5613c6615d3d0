"""The JSON-ready figures the engine reports for one session: its measured stream
(``Engine.metrics``) and its designed latency budget (``Engine.latency_budget``). Callers hold
the engine's lock."""

from __future__ import annotations

from typing import Any

import numpy as np

from worldstream.engine.core.session import Session


def session_metrics(s: Session, now_ns: int) -> dict[str, Any]:
    """One session's entry in ``Engine.metrics()["sessions"]`` at ``now_ns``."""
    gen = list(s.stats.gen_ms)
    return {
        "fps": s.stats.fps(),
        "target_fps": s.degrade.fps,
        "steps": s.steps,
        "chunk_frames": s.chunk_frames,
        "buffer_frames": max(s.clock.buffer_frames(s.frame_index, now_ns), 0.0),
        "gen_ms_per_chunk": float(np.mean(gen)) if gen else None,
        "action_to_frame_ms": s.stats.latency_percentiles(),
        "degraded": s.degrade.degraded,
        "degrade_level": s.degrade.level,
        "dropped_frames": sum(slot.dropped for slot in s.subscribers),
        "subscribers": sum(not slot.closed for slot in s.subscribers),
        "late_frames": s.stats.late_frames,
        "frames": s.stats.frames,
    }


def latency_budget(s: Session, plan_ms: float) -> dict[str, Any]:
    """The session's designed latency budget, given the chunk time it is planned with."""
    wait = 500.0 * s.chunk_frames / s.clock.fps
    after = float(np.mean(s.stats.finish_ms)) if s.stats.finish_ms else 0.0
    return {"mode": s.mode, "chunk_frames": s.chunk_frames, "steps": s.steps,
            "fps": s.degrade.fps, "plan_ms": round(plan_ms, 1), "wait_ms": round(wait, 1),
            "floor_ms": round(plan_ms + wait, 1), "after_delivery_ms": round(after, 1)}
