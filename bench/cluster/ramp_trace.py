"""The autoscaling ramp's schedule and the reading of its trace (``python -m bench scale
--ramp``, run by :mod:`bench.cluster.ramp`): pure functions of plain data, no Ray.

A *sample* (one every ~0.5 s) is ``{"t": s since the start, "sessions": open, "replicas":
alive, "draining": of them draining, "per_replica": [sessions of each], "frames": {session
id: its frame count as its replica reports it, None when not reported}}``. A session's
*record* is ``{"opened": s, "closed": s or None, "error": s or None}``.
"""

from __future__ import annotations

import math


def target_sessions(t: float, *, low: int, high: int, up_s: float, hold_s: float,
                    down_s: float) -> int:
    """Sessions the ramp keeps open ``t`` s after its start: ``low``, rising evenly to
    ``high`` over ``up_s``, held ``hold_s``, falling evenly to ``low`` over ``down_s``, then
    ``low``."""
    if t < up_s:
        return low + math.floor((high - low) * t / up_s)
    t -= up_s
    if t < hold_s:
        return high
    t -= hold_s
    if t < down_s:
        return high - math.floor((high - low) * t / down_s)
    return low


def stalls(samples: list[dict], records: dict[str, dict], end_s: float) -> dict[str, float]:
    """Each session's longest time without a new frame while open, s: from its opening (its
    first frame counts) to its closing (``end_s`` if never closed), over the samples. A frame
    count that changes is progress, one that falls too (a session moved to another replica
    counts afresh there)."""
    out: dict[str, float] = {}
    for sid, rec in records.items():
        until = rec["closed"] if rec["closed"] is not None else end_s
        last_progress, last_count, worst = rec["opened"], None, 0.0
        for s in samples:
            if not rec["opened"] <= s["t"] < until:
                continue
            count = s["frames"].get(sid)
            if count is not None and count != last_count:
                if last_count is not None or count > 0:
                    last_progress = s["t"]
                last_count = count
            worst = max(worst, s["t"] - last_progress)
        out[sid] = round(worst, 3)
    return out


def analyse(samples: list[dict], records: dict[str, dict], *, min_replicas: int,
            max_replicas: int, down_end_s: float, stall_s: float) -> dict:
    """What the trace shows (JSON-ready): ``ramp_replicas_trace`` ([t, sessions, replicas]),
    ``ramp_max_replicas``, ``ramp_min_replicas_after`` (the fewest once the sessions were
    back at ``low``, from ``down_end_s`` on), ``ramp_replicas_final``, ``ramp_within_bounds``
    (every sample in [``min_replicas``, ``max_replicas``]), ``ramp_sessions_dropped``
    (sessions that errored, or went ``stall_s`` or more without a frame, before the bench
    closed them) and their ids, ``ramp_max_frame_stall_s``, and ``ramp_s_to_min`` (from
    ``down_end_s`` to the first sample at ``min_replicas``; None if never)."""
    if not samples:
        raise ValueError("an empty trace")
    end_s = samples[-1]["t"] + 1e-9
    worst = stalls(samples, records, end_s)
    dropped = sorted(sid for sid, rec in records.items()
                     if rec["error"] is not None or worst[sid] >= stall_s)
    counts = [s["replicas"] for s in samples]
    after = [s for s in samples if s["t"] >= down_end_s]
    at_min = next((s["t"] for s in after if s["replicas"] <= min_replicas), None)
    return {
        "ramp_replicas_trace": [[round(s["t"], 2), s["sessions"], s["replicas"]]
                                for s in samples],
        "ramp_max_replicas": max(counts),
        "ramp_min_replicas_after": min(s["replicas"] for s in after) if after else None,
        "ramp_replicas_final": counts[-1],
        "ramp_within_bounds": all(min_replicas <= c <= max_replicas for c in counts),
        "ramp_sessions_dropped": len(dropped),
        "ramp_dropped_ids": dropped,
        "ramp_max_frame_stall_s": max(worst.values(), default=None),
        "ramp_s_to_min": round(at_min - down_end_s, 2) if at_min is not None else None,
    }
