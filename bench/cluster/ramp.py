"""``python -m bench scale --hosts 2 --ramp``: autoscaling under a ramp of sessions.

Emulated replicas (128x128, ``per_replica`` sessions each) autoscaled between
``min_replicas`` and ``max_replicas`` (``RayEngine``, ``engine.cluster.scaling``); the bench
opens sessions ``low`` -> ``high`` over ``up_s``, holds, closes them (at random) down to
``low`` over ``down_s`` and watches ``tail_s`` more. A creation refused (every replica full,
one still starting) is retried at the next look, as a client retries a 503. Every ~0.5 s it
samples the replica count, sessions per replica and each session's frame count, and watches
each session's events for an error; :mod:`bench.cluster.ramp_trace` reads the trace.
"""

from __future__ import annotations

import contextlib
import random
import time

from worldstream.bench.cluster import ramp_trace, runs

#: a replica drains after this long with too many (the product's 30 s would make the ramp
#: minutes long; what is measured is that the drain follows, not the hysteresis), s
SCALE_DOWN_AFTER_S = 4.0
#: a drained replica's sessions may end by themselves this long before they move, s
DRAIN_S = 4.0
#: a session this long without a new frame while open counts as dropped, s
STALL_S = 3.0


def ramp(address: str | None, *, low: int = 2, high: int = 16, per_replica: int = 4,
         min_replicas: int = 1, max_replicas: int = 4, fps: int = 16, up_s: float = 14.0,
         hold_s: float = 6.0, down_s: float = 14.0, tail_s: float = 16.0,
         period_s: float = 0.5, seed: int = 0) -> dict:
    """Run the ramp on the Ray cluster at ``address`` (None: a local Ray); the analysis
    (``ramp_trace.analyse``) plus ``ramp_settings``, ``ramp_refused`` (creations refused
    and retried), ``ramp_moved`` (``recovered`` events: sessions moved off a drained
    replica) and ``ramp_per_replica`` (sessions of each replica, per sample)."""
    from worldstream.engine.core.api import CapacityError

    rng = random.Random(seed)
    records: dict[str, dict] = {}
    samples: list[dict] = []
    open_ids: list[str] = []
    refused = moved = made = 0
    with runs._engine(address, min_replicas, fps=fps, max_sessions=per_replica,
                      media="replica", min_replicas=min_replicas,
                      max_replicas=max_replicas, monitor_period_s=period_s,
                      scale_down_after_s=SCALE_DOWN_AFTER_S, drain_s=DRAIN_S) as eng:
        t0 = time.monotonic()
        total = up_s + hold_s + down_s + tail_s
        while (t := time.monotonic() - t0) < total:
            want = ramp_trace.target_sessions(t, low=low, high=high, up_s=up_s,
                                              hold_s=hold_s, down_s=down_s)
            while len(open_ids) < want:
                try:
                    sid = eng.create_session(f"ramp {made}", seed=made).session_id
                except CapacityError:  # a replica is still starting: next look
                    refused += 1
                    break
                made += 1
                open_ids.append(sid)
                records[sid] = {"opened": t, "closed": None, "error": None}
            while len(open_ids) > want:
                sid = open_ids.pop(rng.randrange(len(open_ids)))
                moved += _watch(eng, sid, records[sid], t)
                with contextlib.suppress(Exception):  # ended by the engine: an error seen
                    eng.close_session(sid)
                records[sid]["closed"] = t
            for sid in open_ids:
                moved += _watch(eng, sid, records[sid], t)
            samples.append(_sample(eng, t0, open_ids))
            time.sleep(max(0.0, period_s - (time.monotonic() - t0 - t)))
    out = ramp_trace.analyse(samples, records, min_replicas=min_replicas,
                             max_replicas=max_replicas, down_end_s=up_s + hold_s + down_s,
                             stall_s=STALL_S)
    out["ramp_settings"] = {
        "low": low, "high": high, "per_replica": per_replica, "min_replicas": min_replicas,
        "max_replicas": max_replicas, "fps": fps, "up_s": up_s, "hold_s": hold_s,
        "down_s": down_s, "tail_s": tail_s, "period_s": period_s,
        "scale_down_after_s": SCALE_DOWN_AFTER_S, "drain_s": DRAIN_S, "stall_s": STALL_S,
        "frame_size": "128x128", "model": "emulated"}
    out["ramp_refused"] = refused
    out["ramp_moved"] = moved
    out["ramp_per_replica"] = [s["per_replica"] for s in samples]
    return out


def _watch(eng, sid: str, rec: dict, t: float) -> int:
    """Read the session's events: an ``error`` (or the session gone) marks ``rec``; returns
    how many ``recovered`` (moves) came."""
    from worldstream.engine.core.api import SessionClosedError

    try:
        queue = eng.events(sid)
    except SessionClosedError:  # the engine ended it: the bench did not
        rec["error"] = rec["error"] if rec["error"] is not None else t
        return 0
    moves = 0
    while not queue.empty():
        event = queue.get_nowait()
        if event.kind == "error" and rec["error"] is None:
            rec["error"] = t
        moves += event.kind == "recovered"
    return moves


def _sample(eng, t0: float, open_ids: list[str]) -> dict:
    eng.refresh()  # NOTE: the monitor's own refresh waits while the autoscaler starts one
    m = eng.metrics()
    t = time.monotonic() - t0
    alive = [r for r in m["replicas"] if r["alive"]]
    return {"t": t, "sessions": len(open_ids), "replicas": len(alive),
            "draining": sum(1 for r in alive if r.get("draining")),
            "per_replica": [len(r["sessions"]) for r in alive],
            "frames": {sid: (m["sessions"].get(sid) or {}).get("frames") for sid in open_ids}}


def markdown(res: dict) -> str:
    """The ramp's section of the run's report."""
    st = res["ramp_settings"]
    return "\n".join([
        "## Autoscaling under a ramp", "",
        f"Sessions {st['low']} -> {st['high']} over {st['up_s']:g} s, held {st['hold_s']:g} "
        f"s, -> {st['low']} over {st['down_s']:g} s, watched {st['tail_s']:g} s more; "
        f"{st['per_replica']} sessions per replica, replicas autoscaled in "
        f"[{st['min_replicas']}, {st['max_replicas']}] (drain after {st['scale_down_after_s']:g}"
        f" s of surplus, sessions moved after {st['drain_s']:g} s). Replicas: at most "
        f"{res['ramp_max_replicas']}, at least {res['ramp_min_replicas_after']} after the ramp "
        f"down (reached {res['ramp_s_to_min']} s after it), within bounds: "
        f"{res['ramp_within_bounds']}; sessions dropped: {res['ramp_sessions_dropped']} "
        f"(longest frame stall {res['ramp_max_frame_stall_s']} s); moved off drained "
        f"replicas: {res['ramp_moved']}; creations refused and retried: "
        f"{res['ramp_refused']}.", ""])
