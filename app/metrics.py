"""What ``GET /api/metrics`` shows to whom: aggregates to anyone the server serves, a
session's own figures to the holder of its token, every session's to the holder of the server
key (``worldstream play --auth``). Session ids, per-session figures and the replicas' process
ids and host names are never shown without a credential."""

from __future__ import annotations

from typing import Any

import numpy as np

from worldstream.streaming.sessions import StreamSession

#: a replica's fields anyone may see (not its pid, host name or sessions)
_REPLICA_PUBLIC = ("id", "alive", "chunk_ms_p50", "chunk_ms_p95", "failovers")


def _session_figures(s: StreamSession) -> dict[str, Any]:
    return {"fps_target": s.info.fps, **s.telemetry.snapshot(),
            "frames_sent": s.telemetry.frames_sent, "recording": s.recorder is not None}


def aggregate(sessions: list[StreamSession]) -> dict[str, Any]:
    """Figures over every live session: how many, frames sent per second (sum and mean),
    frames sent, the server-side queue latency percentiles over their recent frames."""
    fps = [s.telemetry.snapshot()["fps"] or 0.0 for s in sessions]
    queue = [q for s in sessions for q in s.telemetry.queue_samples()]
    p50, p95 = (float(v) for v in np.percentile(queue, [50, 95])) if queue else (None, None)
    return {"sessions": len(sessions), "fps_total": round(sum(fps), 2),
            "fps_mean": round(sum(fps) / len(fps), 2) if fps else None,
            "frames_sent": sum(s.telemetry.frames_sent for s in sessions),
            "recording": sum(s.recorder is not None for s in sessions),
            "queue_ms_p50": p50, "queue_ms_p95": p95}


def metrics_body(model: str, capacity: int, sessions: list[StreamSession],
                 engine_metrics: dict[str, Any], shown: set[str] | None) -> dict[str, Any]:
    """The reply: ``aggregate`` over all ``sessions``; ``sessions`` and the engine's
    per-session ``sessions`` for the ids in ``shown`` only (None: all, the key holder)."""
    def visible(sid: str) -> bool:
        return shown is None or sid in shown

    engine = {k: v for k, v in engine_metrics.items() if k != "replicas"}
    if isinstance(engine.get("sessions"), dict):  # an engine may report a count only
        engine["sessions"] = {sid: m for sid, m in engine["sessions"].items() if visible(sid)}
    body: dict[str, Any] = {
        "model": model, "capacity": capacity, "aggregate": aggregate(sessions),
        "sessions": {s.session_id: _session_figures(s) for s in sessions
                     if visible(s.session_id)},
        "engine": engine}
    if "replicas" in engine_metrics:  # scale-out: which process holds which session
        body["replicas"] = engine_metrics["replicas"] if shown is None else [
            {**{k: r.get(k) for k in _REPLICA_PUBLIC},
             "num_sessions": len(r.get("sessions", ())),
             "sessions": [sid for sid in r.get("sessions", ()) if visible(sid)]}
            for r in engine_metrics["replicas"]]
    return body
