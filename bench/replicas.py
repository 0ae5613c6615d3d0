"""``python -m bench scale --replicas 1,2``: aggregate throughput of engine replicas on Ray.

For each replica count, a fresh :class:`engine.cluster.router.RayEngine` (a local Ray, one
torch thread per replica) serves ``--sessions`` sessions (default 4) asking ``--fps`` each
(default 60: more than one replica of the simulator delivers, so the replicas, not the
playout clocks, bound the rate), with random keys, for ``--seconds``. Reported per count: the
frames every session received through the front end (aggregate and per-session fps), the
replicas' chunk times (p50/p95), where the sessions were placed, and the front end's own CPU
time per session-second (its pump threads, translation and hand-off: what it costs beside
the replicas). Then a failover run: a headless WebRTC client watches and records a session
while the replica holding it (and a second session) is killed with SIGKILL
(``--failover-seconds``). The report ends with a capacity model computed from these figures.
"""

from __future__ import annotations

import argparse
import random
import resource
import sys
import time

import numpy as np


def measure(model: str, replicas: int, *, sessions: int, fps: int, seconds: float,
            model_kwargs: dict | None = None) -> dict:
    """One replica count: throughput and costs (see the module docstring)."""
    from worldstream.engine.cluster.router import RayEngine
    from worldstream.engine.core.api import ActionCommand
    from worldstream.engine.core.config import EngineConfig

    config = EngineConfig(max_sessions=sessions, fps=fps, max_fps=max(fps, 60), mode="responsive")
    with RayEngine(model, replicas=replicas, config=config, model_kwargs=model_kwargs) as engine:
        infos = [engine.create_session(f"scene {i}", seed=i) for i in range(sessions)]
        slots = [engine.subscribe(i.session_id, maxlen=4096) for i in infos]
        time.sleep(3)  # first chunks, text encoder, clocks started
        for slot in slots:
            while slot.get(timeout=0) is not None:
                pass
        rng = random.Random(replicas)
        counts = [0] * sessions
        cpu0 = resource.getrusage(resource.RUSAGE_SELF)
        t0 = time.monotonic()
        seq = 0
        while time.monotonic() - t0 < seconds:
            for info in infos:
                keys = frozenset({rng.choice(["left", "right", "up", "down"])})
                engine.submit(info.session_id, ActionCommand(seq=seq, t_ms=0, keys=keys))
                seq += 1
            end = time.monotonic() + 0.3
            while time.monotonic() < end:
                for i, slot in enumerate(slots):
                    while slot.get(timeout=0) is not None:
                        counts[i] += 1
                time.sleep(0.005)
        elapsed = time.monotonic() - t0
        cpu1 = resource.getrusage(resource.RUSAGE_SELF)
        metrics = engine.metrics()
    front_cpu_s = (cpu1.ru_utime + cpu1.ru_stime) - (cpu0.ru_utime + cpu0.ru_stime)
    chunk = [r["chunk_ms_p50"] for r in metrics["replicas"] if r["chunk_ms_p50"] is not None]
    chunk95 = [r["chunk_ms_p95"] for r in metrics["replicas"] if r["chunk_ms_p95"] is not None]
    per_session = [c / elapsed for c in counts]
    return {"replicas": replicas, "sessions": sessions, "fps_asked": fps,
            "aggregate_fps": float(sum(per_session)),
            "per_session_fps": [round(f, 2) for f in per_session],
            "chunk_ms_p50": float(np.median(chunk)) if chunk else None,
            "chunk_ms_p95": float(np.max(chunk95)) if chunk95 else None,
            "placement": [len(r["sessions"]) for r in metrics["replicas"] if r["alive"]],
            "front_end_cpu_ms_per_session_s": 1e3 * front_cpu_s / (sessions * elapsed)}


def _failover_md(k: dict | None) -> str:
    if k is None:
        return ""
    return (f"## Failover\n\nA replica holding {k['sessions_on_killed_replica']} sessions was "
            f"killed (SIGKILL) while a headless WebRTC client watched and recorded one of them: "
            f"frames resumed on the same track after {k['resume_s']} s (largest gap between "
            f"frames {k['max_gap_s']} s; {k['frames_before']} frames before, "
            f"{k['frames_after']} after), {k['sessions_lost']} sessions lost, "
            f"{k['recovered_events']} `recovered` event(s) on the data channel. The recording: "
            f"HTTP {k['recording_status']}, {k['recording_frames']} frames over "
            f"{k['recording_seconds']} s, largest pts gap {k['recording_max_pts_gap_s']} s.\n")


def _capacity_model(rows: list[dict], fps_target: int = 20) -> str:
    """The sizing paragraph, from the measured throughput of one replica (all its sessions
    batched) and the front end's CPU per frame handed off."""
    one = rows[0]
    per_replica = int(one["aggregate_fps"] // fps_target)
    frames_per_session_s = one["aggregate_fps"] / one["sessions"]
    front_ms_per_frame = one["front_end_cpu_ms_per_session_s"] / max(frames_per_session_s, 1e-9)
    front_per_core = int(1000 / max(front_ms_per_frame * fps_target, 1e-9))
    return "\n".join([
        "## Capacity model", "",
        f"- One replica delivered {one['aggregate_fps']:.0f} frames/s over its "
        f"{one['sessions']} sessions here (one core, chunks of all its sessions batched), so it "
        f"serves about **{per_replica} sessions at {fps_target} fps** (chunk time "
        f"{one['chunk_ms_p95']} ms p95 per batch). Sessions per replica = frames/s of one "
        f"replica / fps per session; measure it for the model and hardware at hand with this "
        f"suite.",
        "- Replicas per host: one per core on CPUs (more only share the cores, and the front "
        "end and Ray's own processes need a share: on this 2-core machine two replicas got "
        "about 1.5 cores between them), or as many as fit a GPU's memory and compute "
        "(`--replica-gpus 0.25`: four replicas of a small model on one GPU).",
        f"- With media from the front end it spends {front_ms_per_frame:.2f} ms of CPU per "
        f"frame it receives and hands to a connection (Ray transfer, time translation, "
        f"slots); WebRTC encoding comes on top (VP8 at 128x128: a few ms a frame). Before "
        f"encoding one front-end core handles about {front_per_core} sessions at "
        f"{fps_target} fps. With `--media-from replica` no frame reaches it: about 0.005 "
        f"core per session (`python -m bench scale --hosts 2 --model emulated`, whose report "
        f"carries the capacity model across hosts, `bench/cluster/capacity.py`).",
        "- For N concurrent users: replicas = ceil(N / sessions per replica), hosts = "
        "ceil(replicas / replicas per host), front-end cores = N x fps x (hand-off + encode "
        "ms per frame) / 1000 with media from the front end, N x 0.005 with media from the "
        "replicas; run several front ends behind a session-affine load balancer when one is "
        "not enough (each front end owns its sessions' replicas).",
    ]) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench scale --replicas", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replicas", required=True,
                        help="comma-separated replica counts, e.g. 1,2")
    parser.add_argument("--model", default="sim")
    parser.add_argument("--sessions", type=int, default=4)
    parser.add_argument("--fps", type=int, default=60, help="fps asked per session")
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--failover-seconds", type=float, default=12.0,
                        help="length of the failover run (0: skip it)")
    parser.add_argument("--json", default=None, help="also write the JSON here")
    args = parser.parse_args(argv)
    counts = [int(c) for c in args.replicas.split(",")]
    if min(counts) < 1 or args.sessions < 1:
        raise SystemExit("replica counts and --sessions must be >= 1")

    from worldstream.bench import results
    from worldstream.bench.common import hardware_info
    from worldstream.bench.results import context_md, table

    rows = []
    for n in counts:
        rows.append(measure(args.model, n, sessions=args.sessions, fps=args.fps,
                            seconds=args.seconds))
        print(f"[replicas] {n}: {rows[-1]['aggregate_fps']:.1f} fps aggregate, placement "
              f"{rows[-1]['placement']}", file=sys.stderr)
    killed = None
    if args.failover_seconds > 0:
        killed = failover(args.model, args.failover_seconds)
        print(f"[replicas] failover: {killed}", file=sys.stderr)
    base = rows[0]["aggregate_fps"]
    for r in rows:
        r["speedup"] = r["aggregate_fps"] / base if base else None
    payload = results.stamp_payload("scale", {
        "hardware": hardware_info(),
        "settings": {"model": args.model, "sessions": args.sessions, "fps": args.fps,
                     "seconds": args.seconds}, "rows": rows, "failover": killed}, argv)
    md = ("# Scale-out: engine replicas on Ray\n\n" + context_md(payload) + "\n"
          + table(["replicas", "aggregate fps", "x one replica", "fps per session",
                   "chunk ms p50", "chunk ms p95", "sessions per replica",
                   "front end CPU ms / session-s"],
                  [[r["replicas"], r["aggregate_fps"], r["speedup"],
                    ", ".join(f"{f:.1f}" for f in r["per_session_fps"]), r["chunk_ms_p50"],
                    r["chunk_ms_p95"], str(r["placement"]),
                    r["front_end_cpu_ms_per_session_s"]] for r in rows])
          + "\n" + _failover_md(killed) + "\n" + _capacity_model(rows))
    folder = results.save("scale_replicas", payload, md, {})
    print(f"report: {folder / 'result.md'}", file=sys.stderr)
    results.print_json(payload, args.json)
    return 0


async def _failover_client(url: str, engine, seconds: float) -> dict:
    """A WebRTC viewer of session A (recording) while A's replica is killed mid-stream."""
    import asyncio
    import json
    import os
    import signal
    from pathlib import Path

    import av
    import httpx
    from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription

    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        made = [(await http.post("/api/sessions", json={"prompt": p, "seed": i})).json()
                for i, p in enumerate(["a green meadow", "a snowy forest", "hot desert dunes"])]
        a = made[0]
        auth = {"Authorization": f"Bearer {a['token']}"}
        pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        pc.addTransceiver("video", direction="recvonly")
        channel = pc.createDataChannel("control")
        messages: list[dict] = []
        channel.on("message", lambda raw: messages.append(json.loads(raw)))
        track_future = asyncio.get_running_loop().create_future()
        pc.on("track", track_future.set_result)
        await pc.setLocalDescription(await pc.createOffer())
        answer = (await http.post(f"/api/sessions/{a['session_id']}/offer", headers=auth,
                                  json={"sdp": pc.localDescription.sdp, "type": "offer"})).json()
        await pc.setRemoteDescription(RTCSessionDescription(**answer))
        track = await asyncio.wait_for(track_future, 30)
        while channel.readyState != "open":
            await asyncio.sleep(0.01)
        channel.send(json.dumps({"type": "record", "seq": 1, "on": True}))
        replicas = engine.metrics()["replicas"]
        victim = next(r for r in replicas if a["session_id"] in r["sessions"])
        on_victim = [m["session_id"] for m in made if m["session_id"] in victim["sessions"]]
        for m in made[1:]:  # the others stream too (as if watched): nothing paused to restore
            engine.set_paused(m["session_id"], False)
        arrivals, t0, killed_at = [], time.monotonic(), None
        while time.monotonic() - t0 < seconds:
            await asyncio.wait_for(track.recv(), 10)
            arrivals.append(time.monotonic())
            if killed_at is None and time.monotonic() - t0 >= seconds / 2:
                os.kill(victim["pid"], signal.SIGKILL)
                killed_at = time.monotonic()
        channel.send(json.dumps({"type": "record", "seq": 2, "on": False}))
        await asyncio.sleep(1.0)
        alive = set(engine.metrics()["sessions"]) | {
            s for r in engine.metrics()["replicas"] if r["alive"] for s in r["sessions"]}
        rec = await http.get(f"/api/sessions/{a['session_id']}/recording.mp4", headers=auth)
        path = Path(f"/tmp/worldstream-failover-{os.getpid()}.mp4")
        path.write_bytes(rec.content)
        with av.open(str(path)) as container:
            stream = container.streams.video[0]
            pts = [float(f.pts * stream.time_base) for f in container.decode(video=0)]
        path.unlink()
        await pc.close()
        for m in made:
            await http.delete(f"/api/sessions/{m['session_id']}",
                              headers={"Authorization": f"Bearer {m['token']}"})
    after = [t for t in arrivals if t >= killed_at]
    before = [t for t in arrivals if t < killed_at]
    gaps = np.diff(pts) if len(pts) > 1 else np.array([0.0])
    return {"sessions_on_killed_replica": len(on_victim),
            "sessions_lost": len([s for s in on_victim if s not in alive]),
            "resume_s": round(after[0] - killed_at, 3) if after else None,
            "max_gap_s": round(float(np.max(np.diff(arrivals))), 3),
            "frames_before": len(before), "frames_after": len(after),
            "recovered_events": sum(1 for m in messages if m.get("kind") == "recovered"),
            "recording_status": rec.status_code, "recording_frames": len(pts),
            "recording_seconds": round(pts[-1] - pts[0], 2) if pts else 0.0,
            "recording_max_pts_gap_s": round(float(gaps.max()), 3)}


def failover(model: str, seconds: float) -> dict:
    """Kill (SIGKILL) the replica of a session watched over WebRTC, mid-stream."""
    import asyncio

    from worldstream.app.cmd_play import play_config
    from worldstream.bench.e2e_server import LocalServer
    from worldstream.engine.cluster.router import RayEngine

    with RayEngine(model, replicas=2, config=play_config(max_sessions=4)) as engine, \
            LocalServer(engine) as server:
        return asyncio.run(_failover_client(server.url, engine, seconds))
