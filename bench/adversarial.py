"""``python -m bench soak --adversarial``: a normal session beside adversarial clients, on a
``worldstream play`` server in a process of its own.

Phases (``--seconds`` each, the normal client a headless WebRTC client in its own process, as
in ``bench e2e``):

1. ``alone``: the normal session by itself (the reference).
   ``calm``: beside a second session whose viewer only pings once a second: the share of an
   engine that two streams get (on a model that saturates a core, about half each), the
   reference that shows what the floods below add.
2. ``prompts``: beside a WebSocket client sending a new random 380-character prompt every
   40 ms (25/s, under the rate limit).
3. ``forks``: beside a WebSocket client that sends ``next`` x4, then a ``fork`` every 40 ms
   and never reads (its receive queue holds one message).
4. ``offers``: beside a client posting the same valid offer (its peer gone) every 35 ms.
   ``oversized``: beside ten clients sending 8 MB data-channel messages (:mod:`bench.oversized`),
   with the server's resident memory sampled (goal: growth <= 50 MB). ``--phases`` picks some.

Each reports the normal session's fps and action-to-photon p50/p95; goals: fps >= 90% of
``alone``, p95 within +20%. Then:

5. ``memory``: the non-reading fork client alone for ``--rss-minutes``, then its session
   deleted: the server's resident memory at the start, its peak and 5 s after the DELETE
   (goal: end within +50 MB of the start).
6. ``vanish``: with the server full (``--max-sessions 2``), one client records over its data
   channel and its process is killed (SIGKILL: a crashed tab, no DELETE, no DTLS close),
   another creates a session and never connects; a new user retries every 0.5 s: seconds
   until admitted (goal <= 30 s). The vanished client's recording is then downloaded with its
   token and decoded.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import random
import socket
import string
import subprocess
import sys
import time
from pathlib import Path

FLOOD_PERIOD_S = {"calm": 1.0, "prompts": 0.040, "forks": 0.040, "offers": 0.035}


def server_rss_mib(pid: int) -> float:
    """Resident memory of process ``pid`` (Linux ``/proc/PID/status`` VmRSS), MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


class PlayServer:
    """``worldstream play`` in a subprocess on a free loopback port (``model`` None: the
    CLI's default, e.g. with ``extra=["--env", ENV]`` for a game; ``extra``: more flags)."""

    def __init__(self, model: str | None, max_sessions: int, threads: int,
                 extra: list[str] | None = None):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "GRADIO_ANALYTICS_ENABLED": "False"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "worldstream.app.cli", "play",
             *(["--model", model] if model else []), *(extra or []),
             "--port", str(self.port), "--max-sessions", str(max_sessions)], env=env)

    def __enter__(self) -> PlayServer:
        import httpx

        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("the play server exited")
            try:
                if httpx.get(f"{self.url}/api/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                time.sleep(0.5)
        raise RuntimeError("the play server did not start within 300 s")

    def __exit__(self, *exc) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def _auth(created: dict) -> dict:
    return {"Authorization": f"Bearer {created['token']}"}


async def dead_offer() -> str:
    """A valid offer as the page makes it (recvonly video, a ``control`` data channel) whose
    peer connection is closed at once: answering it can never lead to a connection."""
    from aiortc import RTCConfiguration, RTCPeerConnection

    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    pc.addTransceiver("video", direction="recvonly")
    pc.createDataChannel("control")
    await pc.setLocalDescription(await pc.createOffer())
    sdp = pc.localDescription.sdp
    await pc.close()
    return sdp


async def flood(url: str, kind: str, seconds: float) -> dict:
    """One adversary for ``seconds``; returns what it sent and the answers it got."""
    import httpx
    import websockets

    rng = random.Random(0)
    answers: dict[str, int] = {}
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        created = (await http.post("/api/sessions", json={"prompt": "a snowy forest"})).json()
        sid, end = created["session_id"], time.monotonic() + seconds
        ws_url = url.replace("http", "ws") + f"/api/sessions/{sid}/ws?token={created['token']}"
        sent = 0
        if kind == "offers":
            sdp = await dead_offer()
            while time.monotonic() < end:
                r = await http.post(f"/api/sessions/{sid}/offer", headers=_auth(created),
                                    json={"sdp": sdp, "type": "offer"})
                answers[str(r.status_code)] = answers.get(str(r.status_code), 0) + 1
                sent += 1
                await asyncio.sleep(FLOOD_PERIOD_S[kind])
        else:
            # max_queue=1: the client library stops reading once one message is queued, so a
            # client that never calls recv() leaves the server's frames in the TCP buffers
            async with websockets.connect(ws_url, max_queue=1, ping_interval=None) as ws:
                if kind == "forks":
                    for _ in range(4):
                        await ws.send('{"type":"next"}')
                while time.monotonic() < end:
                    if kind == "prompts":
                        text = "".join(rng.choices(string.ascii_lowercase + " ", k=380))
                        message = {"type": "prompt", "seq": sent, "t": 0, "text": text}
                    elif kind == "calm":  # a second viewer that only pings, like the page
                        message = {"type": "ping", "seq": sent, "t": 0}
                    else:
                        message = {"type": "fork", "seq": sent, "k": 4}
                    await ws.send(json.dumps(message))
                    sent += 1
                    await asyncio.sleep(FLOOD_PERIOD_S[kind])
        await http.delete(f"/api/sessions/{sid}", headers=_auth(created))
    return {"sent": sent, "answers": answers}


def _flood_main(url: str, kind: str, seconds: float, oversized: dict | None = None) -> dict:
    if kind == "oversized":
        from worldstream.bench import oversized as big

        return asyncio.run(big.flood(url, seconds=seconds, **oversized))
    return asyncio.run(flood(url, kind, seconds))


def normal_session(url: str, seconds: float, seed: int) -> dict:
    """The normal client's fps and action-to-photon over ``seconds`` (``bench e2e``)."""
    from worldstream.bench.e2e_analysis import analyse_log
    from worldstream.bench.e2e_client import random_script, run_client_process

    log, created = run_client_process(url, random_script(seconds, seed), seconds=seconds,
                                      fps=None, prompt="a green meadow with ponds", seed=seed)
    result = analyse_log(log, created["fps"])
    return {"fps": result["fps"], "fps_target": created["fps"],
            "a2p_p50_ms": result["action_to_photon_ms"]["p50"],
            "a2p_p95_ms": result["action_to_photon_ms"]["p95"],
            "frames": result["frames_received"]}


def phase(url: str, kind: str | None, seconds: float, seed: int,
          oversized: dict | None = None) -> dict:
    """The normal session for ``seconds`` with adversary ``kind`` (None: alone) beside it."""
    if kind is None:
        return normal_session(url, seconds, seed)
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(1) as pool:
        adversary = pool.apply_async(_flood_main, (url, kind, seconds + 4, oversized))
        time.sleep(2)  # the flood is under way before the normal session starts
        result = normal_session(url, seconds, seed)
        result["adversary"] = adversary.get(timeout=seconds + 120)
    return result


async def _memory(url: str, pid: int, minutes: float) -> dict:
    import httpx
    import websockets

    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        start = server_rss_mib(pid)
        created = (await http.post("/api/sessions", json={"prompt": "a snowy forest"})).json()
        sid = created["session_id"]
        ws_url = url.replace("http", "ws") + f"/api/sessions/{sid}/ws?token={created['token']}"
        peak, samples, end = start, [], time.monotonic() + 60 * minutes
        seq, next_sample, connections = 0, time.monotonic(), 0
        while time.monotonic() < end:  # a persistent client: reconnects when dropped
            connections += 1
            try:
                async with websockets.connect(ws_url, max_queue=1, ping_interval=None) as ws:
                    for _ in range(4):
                        await ws.send('{"type":"next"}')
                    while time.monotonic() < end:
                        await ws.send(json.dumps({"type": "fork", "seq": seq, "k": 4}))
                        seq += 1
                        if time.monotonic() >= next_sample:
                            samples.append(round(server_rss_mib(pid), 1))
                            peak = max(peak, samples[-1])
                            next_sample += 10
                        await asyncio.sleep(0.04)
            except websockets.ConnectionClosed:
                await asyncio.sleep(0.5)
        await http.delete(f"/api/sessions/{sid}", headers=_auth(created))
        await asyncio.sleep(5)
        final = server_rss_mib(pid)
    return {"minutes": minutes, "forks_sent": seq, "connections": connections,
            "rss_start_mib": round(start, 1),
            "rss_peak_mib": round(peak, 1), "rss_end_mib": round(final, 1),
            "growth_mib": round(final - start, 1), "samples_mib": samples}


async def _crashing_viewer(url: str, out) -> None:
    """A viewer that connects over WebRTC, records, and then waits to be killed: its process
    is SIGKILLed like a crashed tab (no DELETE, no DTLS close, no ICE goodbye)."""
    import httpx
    from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription

    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        created = (await http.post("/api/sessions", json={"prompt": "a desert"})).json()
        pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        pc.addTransceiver("video", direction="recvonly")
        channel = pc.createDataChannel("control")
        opened = asyncio.get_running_loop().create_future()
        channel.on("open", lambda: opened.set_result(True))
        await pc.setLocalDescription(await pc.createOffer())
        r = await http.post(f"/api/sessions/{created['session_id']}/offer",
                            headers=_auth(created),
                            json={"sdp": pc.localDescription.sdp, "type": "offer"})
        await pc.setRemoteDescription(RTCSessionDescription(**r.json()))
        await asyncio.wait_for(opened, 30)
        channel.send(json.dumps({"type": "record", "seq": 1, "on": True}))
        out.put(created)
        await asyncio.sleep(3600)


def _crashing_viewer_main(url: str, out) -> None:
    asyncio.run(_crashing_viewer(url, out))


async def _vanish(url: str, keep_s: float | None) -> dict:
    import av
    import httpx

    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    viewer = ctx.Process(target=_crashing_viewer_main, args=(url, out), daemon=True)
    viewer.start()
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        crashed = await asyncio.to_thread(out.get, True, 120)
        await asyncio.sleep(4)  # recording
        never = (await http.post("/api/sessions", json={"prompt": "a night"})).json()
        full = (await http.post("/api/sessions", json={"prompt": "x"})).status_code
        viewer.kill()  # the tab crashed
        viewer.join()
        t0 = time.monotonic()
        while True:
            r = await http.post("/api/sessions", json={"prompt": "a green meadow"})
            if r.status_code == 201:
                admitted_s = time.monotonic() - t0
                break
            if time.monotonic() - t0 > 300:
                admitted_s = None
                break
            await asyncio.sleep(0.5)
        if r.status_code == 201:
            await http.delete(f"/api/sessions/{r.json()['session_id']}", headers=_auth(r.json()))
        rec = await http.get(f"/api/sessions/{crashed['session_id']}/recording.mp4",
                             headers=_auth(crashed))
        frames = 0
        if rec.status_code == 200:
            path = Path(f"/tmp/worldstream-vanish-{os.getpid()}.mp4")
            path.write_bytes(rec.content)
            with av.open(str(path)) as container:
                frames = sum(1 for _ in container.decode(video=0))
            path.unlink()
        await http.delete(f"/api/sessions/{never['session_id']}", headers=_auth(never))
    return {"full_answer": full, "admitted_after_s": None if admitted_s is None
            else round(admitted_s, 1), "recording_status": rec.status_code,
            "recording_frames": frames, "recording_bytes": len(rec.content),
            "recording_kept_s": keep_s}


def _markdown(payload: dict) -> str:
    from worldstream.bench.results import context_md, table

    alone = payload["phases"]["alone"]
    calm = payload["phases"].get("calm", {"fps": None, "a2p_p95_ms": None})

    def ratio(a, b):
        return a / b if a and b else None

    rows = []
    for name, p in payload["phases"].items():
        # the oversized phase runs on a server of its own, beside its own reference
        rows.append([name, p["fps"], ratio(p["fps"], p.get("alone_fps") or alone["fps"]),
                     ratio(p["fps"], calm["fps"]),
                     p["a2p_p50_ms"], p["a2p_p95_ms"],
                     (ratio(p["a2p_p95_ms"], p.get("alone_p95_ms") or alone["a2p_p95_ms"])
                      or 1) - 1,
                     (ratio(p["a2p_p95_ms"], calm["a2p_p95_ms"]) or 1) - 1,
                     json.dumps(p.get("adversary", {}).get("answers", {}))])
    mem, van = payload.get("memory"), payload.get("vanish")
    big = payload["phases"].get("oversized")
    text = ("# Soak with adversarial clients (issue 12)\n\n" + context_md(payload) + "\n"
            + table(["phase", "fps", "fps / alone", "fps / calm", "a2p p50 ms", "a2p p95 ms",
                     "p95 vs alone", "p95 vs calm", "adversary's answers"], rows))
    if mem:
        text += (f"\n\nNon-reading fork client for {mem['minutes']} min ({mem['forks_sent']} "
                 f"forks, {mem['connections']} connections): server RSS "
                 f"{mem['rss_start_mib']} MiB at the start, peak "
                 f"{mem['rss_peak_mib']}, {mem['rss_end_mib']} 5 s after its DELETE "
                 f"({mem['growth_mib']:+.1f} MiB).")
    if big:
        from worldstream.bench.oversized import summary

        text += "\n\n" + summary(big)
    if van:
        text += (f"\n\nVanished clients at full capacity (answer before: {van['full_answer']}):"
                 f" a new user admitted after {van['admitted_after_s']} s; the vanished "
                 f"client's recording: HTTP {van['recording_status']}, "
                 f"{van['recording_frames']} frames decoded, kept {van['recording_kept_s']} s.")
    return text + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench soak --adversarial",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="sim", help="builtin or sim (default sim)")
    parser.add_argument("--seconds", type=float, default=20.0, help="length of each phase")
    parser.add_argument("--rss-minutes", type=float, default=5.0,
                        help="minutes of the non-reading fork client (0: skip)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the server")
    parser.add_argument("--skip-vanish", action="store_true")
    parser.add_argument("--phases", default="calm,prompts,forks,offers,oversized",
                        help="flood phases to run beside the normal session (alone: always)")
    parser.add_argument("--oversized-seconds", type=float, default=60.0)
    parser.add_argument("--oversized-clients", type=int, default=10)
    parser.add_argument("--oversized-mb", type=float, default=8.0)
    parser.add_argument("--oversized-period-s", type=float, default=1.0,
                        help="pause of each oversized client between two messages")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.seconds <= 0 or args.rss_minutes < 0:
        raise SystemExit("--seconds must be > 0 and --rss-minutes >= 0")
    kinds = [k for k in args.phases.split(",") if k]
    if unknown := set(kinds) - {*FLOOD_PERIOD_S, "oversized"}:
        raise SystemExit(f"--phases: unknown {sorted(unknown)}")

    from worldstream.bench import results
    from worldstream.bench.common import hardware_info
    from worldstream.streaming.limits import Limits

    phases: dict[str, dict] = {}
    with PlayServer(args.model, max_sessions=2, threads=args.threads) as server:
        phase(server.url, None, 3, seed=99)  # warm-up: first session, encoder, codec
        for kind in [None, *(k for k in kinds if k != "oversized")]:
            name = kind or "alone"
            phases[name] = phase(server.url, kind, args.seconds, seed=len(phases))
            p = phases[name]
            print(f"[adversarial] {name}: {p['fps']:.1f} fps, a2p p50 {p['a2p_p50_ms']} "
                  f"p95 {p['a2p_p95_ms']} ms", file=sys.stderr)
        memory = None
        if args.rss_minutes > 0:
            memory = asyncio.run(_memory(server.url, server.proc.pid, args.rss_minutes))
            print(f"[adversarial] memory: {memory}", file=sys.stderr)
        vanish = None
        if not args.skip_vanish:
            vanish = asyncio.run(_vanish(server.url, Limits().recording_keep_s))
            print(f"[adversarial] vanish: {vanish}", file=sys.stderr)
    if "oversized" in kinds:  # one session per client: a server of its own, with room
        from worldstream.bench.oversized import run

        phases["oversized"] = run(args)
        print(f"[adversarial] oversized: {phases['oversized']}", file=sys.stderr)
    payload = results.stamp_payload("soak", {
        "hardware": hardware_info(),
        "settings": {"model": args.model, "seconds": args.seconds, "rss_minutes": args.rss_minutes,
                     "threads": args.threads, "load": os.getloadavg(), "phases": kinds,
                     "oversized_seconds": args.oversized_seconds},
        "phases": phases, "memory": memory, "vanish": vanish}, ["--adversarial", *(argv or [])])
    folder = results.save("soak_adversarial", payload, _markdown(payload), {})
    print(f"report: {folder / 'result.md'}", file=sys.stderr)
    results.print_json(payload, args.json)
    return 0
