"""The three measurements of ``python -m bench scale --hosts``, each on a fresh
:class:`~engine.cluster.router.RayEngine` joined to the running cluster (``address``):

- :func:`throughput`: ``replicas`` x ``per_replica`` sessions at ``fps``, steered with random
  keys through the front end; frames counted by the replicas (``frames`` in their metrics),
  the front end's CPU time over the same window.
- :func:`frontend_cpu`: WebRTC (or WebSocket: ``ws_viewers``) viewers (another process) of
  ``sessions`` sessions; the front end's CPU per session with media sent by the front end,
  then by the replicas.
- :func:`host_loss`: WebRTC viewers of ``sessions`` sessions across the hosts, one recording;
  every process of one host SIGKILLed mid-stream; how long each session's frames stopped.
"""

from __future__ import annotations

import json
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from worldstream.bench.cluster import hosts


def _cpu_s() -> float:
    use = resource.getrusage(resource.RUSAGE_SELF)
    return use.ru_utime + use.ru_stime


def _engine(address: str | None, replicas: int, *, fps: int, max_sessions: int, media: str,
            frame_size: str = "128x128", b_ms: float | None = None, **router_kwargs):
    """A RayEngine of emulated replicas joined to ``address`` (None: a local Ray);
    ``router_kwargs`` go to it (autoscaling bounds and timings)."""
    from worldstream.engine.cluster.replica import EngineReplica
    from worldstream.engine.cluster.router import RayEngine
    from worldstream.engine.core.config import EngineConfig
    from worldstream.streaming.replica_media import MediaReplica

    kwargs: dict = {"frame_size": frame_size}
    if b_ms is not None:
        kwargs["b_ms"] = b_ms
    # NOTE: threads=None: the emulated backend never runs torch, and importing it to set a
    # thread count costs each replica a second of CPU at start
    return RayEngine("emulated", replicas=replicas, address=address, threads=None,
                     config=EngineConfig(max_sessions=max_sessions, fps=fps,
                                         mode="responsive"),
                     model_kwargs=kwargs,
                     replica_cls=MediaReplica if media == "replica" else EngineReplica,
                     **router_kwargs)


def _replica_hosts(engine) -> dict[str, str]:
    """Public session id -> the host address of its replica."""
    return {sid: r["host"] for r in engine.metrics()["replicas"] if r["alive"]
            for sid in r["sessions"]}


def throughput(address: str, replicas: int, *, per_replica: int, fps: int, seconds: float,
               warmup_s: float = 4.0) -> dict:
    """Aggregate and per-session frame rates, action-to-frame p95 and the front end's CPU."""
    from worldstream.engine.core.api import ActionCommand

    with _engine(address, replicas, fps=fps, max_sessions=per_replica, media="replica") as eng:
        sessions = [eng.create_session(f"scene {i}", seed=i).session_id
                    for i in range(replicas * per_replica)]
        where = _replica_hosts(eng)
        rng, seq = random.Random(replicas), 0

        def steer() -> None:
            nonlocal seq
            for sid in sessions:
                keys = frozenset({rng.choice(["left", "right", "up", "down"])})
                eng.submit(sid, ActionCommand(seq=seq, t_ms=0, keys=keys))
                seq += 1

        end = time.monotonic() + warmup_s
        while time.monotonic() < end:
            steer()
            time.sleep(0.25)
        eng.refresh()
        frames0 = {s: m["frames"] for s, m in eng.metrics()["sessions"].items()}
        cpu0, t0 = _cpu_s(), time.monotonic()
        while time.monotonic() - t0 < seconds:
            steer()
            time.sleep(0.25)
        eng.refresh()
        elapsed, cpu = time.monotonic() - t0, _cpu_s() - cpu0
        metrics = eng.metrics()
    per = {s: (m["frames"] - frames0.get(s, 0)) / elapsed for s, m in metrics["sessions"].items()}
    p95 = [m["action_to_frame_ms"]["p95"] for m in metrics["sessions"].values()
           if m["action_to_frame_ms"].get("p95") is not None]
    placed: dict[str, int] = {}
    for r in metrics["replicas"]:
        placed[r["host"]] = placed.get(r["host"], 0) + 1
    return {"replicas": replicas, "sessions": len(sessions), "fps_asked": fps,
            "replicas_per_host": placed, "sessions_per_host": _count(where.values()),
            "aggregate_fps": round(sum(per.values()), 2),
            "min_session_fps": round(min(per.values()), 2) if per else 0.0,
            "mean_session_fps": round(float(np.mean(list(per.values()))), 2) if per else 0.0,
            "a2f_p95_ms_median": round(float(np.median(p95)), 1) if p95 else None,
            "a2f_p95_ms_max": round(float(np.max(p95)), 1) if p95 else None,
            "chunk_ms_p50": _median([r["chunk_ms_p50"] for r in metrics["replicas"]]),
            "frontend_core_per_session": round(cpu / elapsed / max(len(sessions), 1), 5)}


def _count(values) -> dict[str, int]:
    out: dict[str, int] = {}
    for v in values:
        out[v] = out.get(v, 0) + 1
    return out


def _median(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return round(float(np.median(values)), 1) if values else None


def _viewers(url: str, sessions: int, seconds: float, record: int,
             transport: str = "webrtc") -> tuple:
    out = Path(tempfile.mkstemp(prefix="ws-viewers-", suffix=".json")[1])
    module, extra = "viewers", []
    if transport != "webrtc":  # websocket: where the front end says; websocket-front: its own
        module, extra = "ws_viewers", ["--route", "front" if transport.endswith("front")
                                       else "auto"]
    proc = subprocess.Popen([sys.executable, "-m", f"worldstream.bench.cluster.{module}",
                             "--url", url, "--sessions", str(sessions), "--seconds",
                             f"{seconds:g}", "--record", str(record), "--out", str(out),
                             *extra], stdout=subprocess.PIPE, text=True)
    return proc, out


def _wait_ready(proc) -> None:
    line = proc.stdout.readline()
    if line.strip() != "ready":
        proc.kill()
        raise RuntimeError(f"the viewers did not start ({line!r})")


def _finish(proc, out: Path) -> list[dict]:
    if proc.wait(120) != 0:
        raise RuntimeError(f"the viewers failed (exit {proc.returncode})")
    try:
        return json.loads(out.read_text())
    finally:
        out.unlink(missing_ok=True)


def _serve(engine, sessions: int):
    from worldstream.bench.e2e_server import LocalServer
    from worldstream.streaming.limits import Limits

    limits = Limits(max_sessions=sessions, creations_per_s=50, creation_burst=50)
    return LocalServer(engine, limits, host=_own_address())


def _own_address() -> str:
    env = hosts.cluster_env()
    return env["hosts"].get("h0", "127.0.0.1") if env else "127.0.0.1"


def frontend_cpu(address: str | None, media: str, *, sessions: int = 2, fps: int = 16,
                 seconds: float = 8.0, frame_size: str = "832x480",
                 transport: str = "webrtc") -> dict:
    """The front end's CPU per watched session with media sent by ``media`` (``front`` or
    ``replica``), viewed over ``transport``: ``webrtc``, ``websocket`` (the URL the front end
    names: the replica's with media from the replicas) or ``websocket-front`` (the front
    end's own route: a client that reaches only it). NOTE: the model's time is set to 0 per
    frame (``b_ms=0``): this measures the media path, and every session must get its ``fps``
    whatever the emulated GPU."""
    replicas = 2 if media == "replica" else 1
    with _engine(address, replicas, fps=fps, max_sessions=sessions, media=media,
                 frame_size=frame_size, b_ms=0.0) as eng, _serve(eng, sessions) as server:
        proc, out = _viewers(server.url, sessions, seconds + 2, 0, transport)
        _wait_ready(proc)
        time.sleep(1.0)
        cpu0, t0 = _cpu_s(), time.monotonic()
        time.sleep(seconds)
        cpu, elapsed = _cpu_s() - cpu0, time.monotonic() - t0
        views = _finish(proc, out)
    rates = [_rate(v["arrivals"]) for v in views]
    return {"media": media, "transport": transport, "sessions": sessions,
            "frame_size": frame_size, "fps_asked": fps,
            "viewer_fps": [round(r, 2) for r in rates],
            "frontend_core_per_session": round(cpu / elapsed / sessions, 5)}


def _rate(arrivals: list[float]) -> float:
    return (len(arrivals) - 1) / (arrivals[-1] - arrivals[0]) if len(arrivals) > 1 else 0.0


def host_loss(address: str, *, sessions: int = 8, replicas: int = 4, fps: int = 16,
              before_s: float = 4.0, after_s: float = 8.0, lose: str = "h1") -> dict:
    """Kill every process of host ``lose`` while ``sessions`` WebRTC sessions stream (one
    recording); see the module docstring. The lost host's address is ``hosts``' own."""
    env = hosts.cluster_env() or {"hosts": {}, "prefix": hosts.PREFIX}
    lost_address = env["hosts"].get(lose)
    with _engine(address, replicas, fps=fps, max_sessions=sessions, media="replica") as eng, \
            _serve(eng, sessions * 2) as server:
        proc, out = _viewers(server.url, sessions, before_s + after_s, 1)
        _wait_ready(proc)
        time.sleep(before_s)
        where = _replica_hosts(eng)
        killed_at = time.monotonic()
        killed = hosts.kill_host(lose, env["prefix"])
        time.sleep(max(after_s - 2.0, 1.0))
        after = _replica_hosts(eng)
        views = _finish(proc, out)
    on_lost = [v for v in views if where.get(v["session_id"]) == lost_address]
    gaps = [_gap_across(v["arrivals"], killed_at) for v in views]
    lost_gaps = [_gap_across(v["arrivals"], killed_at) for v in on_lost]
    end = max((v["arrivals"][-1] for v in views if v["arrivals"]), default=killed_at)
    alive = [v for v in views if v["arrivals"] and v["arrivals"][-1] > end - 1.0]
    record = next((v.get("recording") for v in views if "recording" in v), None)
    return {"sessions": sessions, "replicas": replicas, "lost_host": lost_address,
            "killed_processes": len(killed), "sessions_on_lost_host": len(on_lost),
            "sessions_per_host_before": _count(where.values()),
            "sessions_per_host_after": _count(after.values()),
            "host_loss_max_gap_s": _largest(lost_gaps),
            "max_gap_any_session_s": _largest(gaps),
            "host_loss_sessions_lost": sessions - len(alive),
            "reconnects": sum(len(v["reconnects"]) for v in views),
            "breakdown_s": _breakdown(on_lost, killed_at),
            "recovered_events": sum(v["recovered"] for v in views),
            "viewer_errors": [e for v in views for e in v["errors"]][:5],
            "recording": record}


def _gap_across(arrivals: list[float], t: float) -> float | None:
    """The gap between the last frame before ``t`` and the first after (None: none after)."""
    before = [a for a in arrivals if a <= t]
    after = [a for a in arrivals if a > t]
    if not after:
        return None
    return after[0] - (before[-1] if before else t)


def _breakdown(views: list[dict], t: float) -> dict[str, float | None]:
    """Medians over the moved sessions: the kill to their last frame (frames in flight),
    the last frame to the viewer's new offer (its silence watchdog), the new offer to the
    first frame (failover, signalling, ICE, DTLS, the first chunk)."""
    parts: dict[str, list[float]] = {"kill_to_last_frame": [], "silence_to_offer": [],
                                     "offer_to_frame": []}
    for v in views:
        last = max((a for a in v["arrivals"] if a <= t + 0.5), default=None)
        offer = min((r for r in v["reconnects"] if r > t), default=None)
        first = min((a for a in v["arrivals"] if offer is not None and a > offer), default=None)
        if last is None or offer is None or first is None:
            continue
        parts["kill_to_last_frame"].append(last - t)
        parts["silence_to_offer"].append(offer - last)
        parts["offer_to_frame"].append(first - offer)
    return {k: round(float(np.median(v)), 3) if v else None for k, v in parts.items()}


def _largest(gaps: list[float | None]) -> float | None:
    """The largest gap, None when a session never resumed (or there is none)."""
    if not gaps or any(g is None for g in gaps):
        return None
    return round(max(g for g in gaps if g is not None), 3)
