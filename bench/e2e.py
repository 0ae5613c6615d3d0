"""``python -m bench e2e``: action-to-photon latency through the real server, WebRTC and codec.

A headless aiortc client (``PROTOCOL.md``: one recvonly video transceiver, a ``control`` data
channel) opens a session, replays an action script (``--script``: a JSON list of
``{"t_s": float, "keys": [...]}``; default: a seeded random script, a key change every
0.3-1.0 s) and receives the video. Each decoded video frame is matched to its ``frame``
metadata message by RTP timestamp (aiortc's receiver rebases timestamps on the first packet it
gets, so the constant offset is found as the one that matches most frames), which names the
newest action the frame was conditioned on. Reported: action-to-photon p50/p95/p99 (client
send -> the frame's last RTP packet received: the moment a browser starts decoding it), fps
received, dropped frames (generated indices never received), inter-frame jitter, and the
per-stage ms of the path (queue, denoise, cache fill, decode from the engine; server queue from
the server; encode + transport = frame complete at the client - its metadata arrival).

NOTE: aiortc's receiver hands a frame to its decoder only when the *next* frame's first packet
arrives (``aiortc/jitterbuffer.py``: a frame is complete when the timestamp changes; browsers
use the RTP marker bit), one frame interval later. The client therefore notes when each frame's
marker packet arrives (a wrapper around the receiver's private ``_handle_rtp_packet``: aiortc
has no public packet hook) and reports the decoded time separately
(``action_to_decoded_ms``).

Without ``--url`` the suite serves the app in-process (``--model builtin|sim``, ``--mode``) on a
loopback port; then every frame the server sent is also kept, and each decoded frame is
compared with it (``corrupted_frames``: PSNR under :data:`CORRUPT_PSNR_DB`, i.e. a broken
picture, not codec loss). ``--stress N`` runs N busy processes beside the server and client.
The session is also written as a latency-lab export (``bench.analyse`` format).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from worldstream.bench import harness
from worldstream.bench.stats import match_actions, summarize

RTP_MOD = 2**32
#: a decoded frame this far below the frame sent is corrupted (VP8 at the stream's bitrate
#: keeps 128x128 frames above ~30 dB; a frame decoded against a lost reference falls far below)
CORRUPT_PSNR_DB = 20.0
#: RTP ticks a received timestamp may differ from the one sent: aiortc's encoder rounds the
#: 90 kHz pts on the way (measured: 12000 sent arrives as 11999)
RTP_TOLERANCE = 2


def _nearest(sorted_rtp: np.ndarray, value: int) -> int | None:
    """The sent timestamp within :data:`RTP_TOLERANCE` of ``value``, or None."""
    i = int(np.searchsorted(sorted_rtp, value))
    best = None
    for j in (i - 1, i):
        if 0 <= j < sorted_rtp.size and abs(int(sorted_rtp[j]) - value) <= RTP_TOLERANCE:
            if best is None or abs(int(sorted_rtp[j]) - value) < abs(best - value):
                best = int(sorted_rtp[j])
    return best


def random_script(seconds: float, seed: int = 0) -> list[dict]:
    """Key changes at random moments (every 0.3-1.0 s) for ``seconds``."""
    from worldstream.bench.streams import KEY_SETS

    rng = random.Random(seed)
    t, script = 0.5, []
    while t < seconds:
        script.append({"t_s": round(t, 3), "keys": rng.choice(KEY_SETS)})
        t += rng.uniform(0.3, 1.0)
    return script


def rtp_offset(received_pts: list[int], sent_rtp: list[int]) -> int | None:
    """The offset ``c`` with ``(pts - c) mod 2**32`` in ``sent_rtp`` for the most received
    frames; None when nothing was received or sent.

    NOTE: on an evenly paced stream whose first frames were lost, shifts by whole frame
    intervals match equally well; ties go to 0 (the first frame arrived, the usual case on
    loopback), then to the smallest ``c``. Skipped ticks (engine stalls) break the tie.
    """
    if not received_pts or not sent_rtp:
        return None
    sent = np.unique(np.asarray(sent_rtp, dtype=np.int64))
    best, best_hits = None, -1
    candidates = {(received_pts[0] - r) % RTP_MOD for r in sent_rtp}
    for c in sorted(candidates, key=lambda c: (c != 0, c)):
        hits = sum(_nearest(sent, (p - c) % RTP_MOD) is not None for p in received_pts)
        if hits > best_hits:
            best, best_hits = c, hits
    return best


def jitter_ms(arrivals_ms: list[float], fps: float) -> dict:
    """Inter-arrival jitter: ``std`` of the intervals and p95 of |interval - 1/fps|, ms."""
    if len(arrivals_ms) < 3:
        return {"std_ms": None, "p95_abs_dev_ms": None}
    d = np.diff(np.asarray(arrivals_ms))
    return {"std_ms": float(d.std()),
            "p95_abs_dev_ms": float(np.percentile(np.abs(d - 1000.0 / fps), 95))}


@dataclass
class ClientLog:
    """Everything the client saw, on its own ``perf_counter`` clock (ms)."""

    actions: list[dict] = field(default_factory=list)       # seq, t_ms, keys
    messages: list[dict] = field(default_factory=list)      # frame messages + "t_recv_ms"
    frames: list[tuple[int, float]] = field(default_factory=list)  # (pts, t_decoded_ms)
    complete_ms: dict[int, float] = field(default_factory=dict)  # RTP ts -> marker packet in
    rtp_origin: int | None = None  # RTP timestamp of the first packet (aiortc's pts 0)
    pictures: dict[int, object] = field(default_factory=dict)  # pts -> decoded rgb (optional)
    errors: list[dict] = field(default_factory=list)
    first_photon_ms: float | None = None  # offer sent -> first decoded frame


def _now_ms() -> float:
    return time.perf_counter_ns() / 1e6


def watch_packets(receiver, log: ClientLog) -> None:
    """Note when each frame's last RTP packet (marker bit) arrives (see the module NOTE)."""
    handle = receiver._handle_rtp_packet

    async def noted(packet, arrival_time_ms):
        if log.rtp_origin is None:
            log.rtp_origin = packet.timestamp
        if packet.marker:
            log.complete_ms.setdefault(packet.timestamp, _now_ms())
        await handle(packet, arrival_time_ms)

    receiver._handle_rtp_packet = noted


def photon_ms(log: ClientLog, pts: int, t_decoded_ms: float) -> float:
    """When the frame of pts ``pts`` was complete at the client (its marker packet), or its
    decode time when that packet was not seen."""
    if log.rtp_origin is None:
        return t_decoded_ms
    return min(log.complete_ms.get((pts + log.rtp_origin) % RTP_MOD, t_decoded_ms), t_decoded_ms)


async def run_client(url: str, script: list[dict], *, seconds: float, fps: int | None,
                     prompt: str, seed: int = 0, first_frame_timeout_s: float = 120.0,
                     settings: dict | None = None,
                     keep_pictures: bool = False) -> tuple[ClientLog, dict]:
    """Open a session at ``url`` (``settings``: the fields of a ``settings`` message sent
    first, e.g. ``{"mode": "responsive"}``); once the first video frame is in, replay
    ``script`` and stream for ``seconds``; close. ``keep_pictures``: keep every decoded
    frame's rgb in ``log.pictures``. Returns the log and the session's creation reply. Raises
    RuntimeError on HTTP errors, or when no frame comes within ``first_frame_timeout_s``."""
    import httpx
    from aiortc import RTCPeerConnection, RTCSessionDescription
    from aiortc.mediastreams import MediaStreamError

    log = ClientLog()
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        body = {"prompt": prompt, "seed": seed, **({"fps": fps} if fps else {})}
        reply = await http.post("/api/sessions", json=body)
        if reply.status_code != 201:
            raise RuntimeError(f"POST /api/sessions: {reply.status_code} {reply.text}")
        session = reply.json()
        auth = {"Authorization": f"Bearer {session['token']}"}
        pc = RTCPeerConnection()
        watch_packets(pc.addTransceiver("video", direction="recvonly").receiver, log)
        channel = pc.createDataChannel("control", ordered=True)
        opened = asyncio.Event()
        readers: list[asyncio.Task] = []
        channel.on("open", opened.set)

        @channel.on("message")
        def on_message(raw):
            t = _now_ms()
            msg = json.loads(raw)
            if msg.get("type") == "frame":
                log.messages.append({**msg, "t_recv_ms": t})
            elif msg.get("type") == "error":
                log.errors.append(msg)

        async def read(track):
            while True:
                try:
                    frame = await track.recv()
                except MediaStreamError:
                    return
                t = _now_ms()
                log.frames.append((int(frame.pts), t))
                if keep_pictures:
                    log.pictures[int(frame.pts)] = frame.to_ndarray(format="rgb24")

        @pc.on("track")
        def on_track(track):
            if track.kind == "video":
                readers.append(asyncio.ensure_future(read(track)))

        try:
            t_offer = _now_ms()
            await pc.setLocalDescription(await pc.createOffer())
            answer = await http.post(f"/api/sessions/{session['session_id']}/offer", headers=auth,
                                     json={"sdp": pc.localDescription.sdp, "type": "offer"})
            if answer.status_code != 200:
                raise RuntimeError(f"offer: {answer.status_code} {answer.text}")
            await pc.setRemoteDescription(RTCSessionDescription(**answer.json()))
            await asyncio.wait_for(opened.wait(), 30)
            if settings:
                channel.send(json.dumps({"type": "settings", "seq": 0, **settings}))
            # the script starts with the stream: start-up is time to first photon, not latency
            deadline = time.monotonic() + first_frame_timeout_s
            while not log.frames:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"no video frame within {first_frame_timeout_s} s")
                await asyncio.sleep(0.01)
            log.first_photon_ms = log.frames[0][1] - t_offer
            start = time.monotonic()
            for seq, step in enumerate(sorted(script, key=lambda s: s["t_s"]), start=1):
                if step["t_s"] >= seconds:
                    break
                await asyncio.sleep(max(0.0, start + step["t_s"] - time.monotonic()))
                t = _now_ms()
                channel.send(json.dumps({"type": "action", "seq": seq, "t": t,
                                         "keys": list(step["keys"])}))
                log.actions.append({"seq": seq, "t_ms": t, "keys": list(step["keys"])})
            await asyncio.sleep(max(0.0, start + seconds - time.monotonic()))
        finally:
            await http.delete(f"/api/sessions/{session['session_id']}", headers=auth)
            for task in readers:
                task.cancel()
            await pc.close()
    return log, session


def analyse_log(log: ClientLog, fps: float, warmup_s: float = 1.0,
                sent: dict[int, object] | None = None) -> dict:
    """Figures of one client log (see the module docstring); frames received in the first
    ``warmup_s`` after the first frame are left out of fps and jitter (stream start-up).
    ``sent``: frame index -> the rgb the server sent, to count corrupted frames."""
    matched = match_frames(log)
    decoded = match_frames(log, decoded=True)
    seqs = [a["seq"] for a in log.actions]
    times = [a["t_ms"] for a in log.actions]
    lat = match_actions(seqs, times, [m["action_seq"] for _, m in matched],
                        [t for t, _ in matched])
    lat_decoded = match_actions(seqs, times, [m["action_seq"] for _, m in decoded],
                                [t for t, _ in decoded])
    t_frames = [t for _, t in log.frames]
    steady = [t for t in t_frames if t_frames and t >= t_frames[0] + warmup_s * 1e3]
    span_s = (steady[-1] - steady[0]) / 1e3 if len(steady) > 1 else 0.0
    received = {m["index"] for _, m in matched}
    # frames after the last one received may still be in flight when the session closes
    indices = sorted(i for i in {m["index"] for m in log.messages}
                     if received and i <= max(received))
    generated = range(indices[0], indices[-1] + 1) if indices else range(0)
    stages: dict[str, list[float]] = {}
    for t, m in matched:
        for k, v in m.get("stages_ms", {}).items():
            stages.setdefault(k, []).append(v)
        if m.get("queue_ms") is not None:
            stages.setdefault("server_queue", []).append(m["queue_ms"])
        stages.setdefault("encode_transport", []).append(t - m["t_recv_ms"])
    return {
        "action_to_photon_ms": summarize(lat[~np.isnan(lat)]),
        "action_to_decoded_ms": summarize(lat_decoded[~np.isnan(lat_decoded)]),
        **corruption(log, sent),
        "actions_sent": len(seqs), "actions_unanswered": int(np.isnan(lat).sum()),
        "frames_received": len(log.frames), "frames_matched": len(matched),
        "fps": (len(steady) - 1) / span_s if span_s > 0 else 0.0,
        "dropped_frames": len([i for i in generated if i not in received]),
        "frames_generated": len(generated),
        "jitter": jitter_ms(steady, fps),
        "stages_ms": {k: float(np.median(v)) for k, v in stages.items()},
        "first_photon_ms": log.first_photon_ms,
        "errors": log.errors,
    }


def match_frames(log: ClientLog, decoded: bool = False) -> list[tuple[float, dict]]:
    """``(t_photon_ms, frame message)`` of every received frame whose metadata was received
    (RTP timestamp after the offset of :func:`rtp_offset`, within :data:`RTP_TOLERANCE`);
    ``decoded``: the time aiortc decoded it instead (:func:`photon_ms`)."""
    return [(t if decoded else photon_ms(log, pts, t), m) for pts, t, m in _matched(log)]


def _matched(log: ClientLog) -> list[tuple[int, float, dict]]:
    offset = rtp_offset([p for p, _ in log.frames], [m["rtp_ts"] for m in log.messages])
    if offset is None:
        return []
    by_rtp = {m["rtp_ts"]: m for m in log.messages}
    sent = np.unique(np.asarray(list(by_rtp), dtype=np.int64))
    matched = []
    for pts, t in log.frames:
        rtp = _nearest(sent, (pts - offset) % RTP_MOD)
        if rtp is not None:
            matched.append((pts, t, by_rtp[rtp]))
    return matched


def psnr_db(a, b) -> float:
    """PSNR of two uint8 pictures of one shape, dB (inf when identical)."""
    err = np.mean((np.asarray(a, np.float64) - np.asarray(b, np.float64)) ** 2)
    return float("inf") if err == 0 else float(10 * np.log10(255.0**2 / err))


def corruption(log: ClientLog, sent: dict[int, object] | None) -> dict:
    """``corrupted_frames`` (decoded frames under :data:`CORRUPT_PSNR_DB` against the frame
    the server sent with that index), ``frames_checked`` and the PSNR p5/p50 (dB); empty when
    no sent frames or pictures were kept."""
    if not sent or not log.pictures:
        return {}
    scores = []
    for pts, _, m in _matched(log):
        picture, original = log.pictures.get(pts), sent.get(m["index"])
        if picture is not None and original is not None:
            h, w = np.asarray(original).shape[:2]
            scores.append(psnr_db(np.asarray(picture)[:h, :w], original))
    finite = np.asarray([min(v, 99.0) for v in scores])
    return {"corrupted_frames": int((finite < CORRUPT_PSNR_DB).sum()),
            "frames_checked": len(scores),
            "psnr_db_p5": float(np.percentile(finite, 5)) if scores else None,
            "psnr_db_p50": float(np.median(finite)) if scores else None}


def to_export(log: ClientLog) -> list[dict]:
    """The log as a latency-lab export (``bench.analyse`` format)."""
    frames = match_frames(log)
    out = []
    for a in log.actions:
        hit = next(((t, m) for t, m in frames if m["action_seq"] >= a["seq"] and t >= a["t_ms"]),
                   None)
        out.append({"action_seq": a["seq"], "t_action_ms": a["t_ms"], "keys": a["keys"],
                    "t_photon_ms": hit[0] if hit else None,
                    "frame_index": hit[1]["index"] if hit else None,
                    "stages_ms": hit[1].get("stages_ms") if hit else None})
    return out


def _client_main(url: str, script: list[dict], kwargs: dict) -> tuple[ClientLog, dict]:
    return asyncio.run(run_client(url, script, **kwargs))


def run_client_process(url: str, script: list[dict], **kwargs) -> tuple[ClientLog, dict]:
    """:func:`run_client` in a process of its own, as a browser would be: in the server's
    process its decoding and Python work would contend for the server's GIL and skew both."""
    import concurrent.futures
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=ctx) as pool:
        return pool.submit(_client_main, url, script, kwargs).result()


class SentFrames:
    """Every frame the in-process engine sends on the first session opened after entry
    (``frames``: index -> rgb), taken from a slot of its own, for the corruption check."""

    def __init__(self, engine):
        self.engine, self.frames = engine, {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, daemon=True)

    def _follow(self) -> None:
        slot = None
        while slot is None and not self._stop.wait(0.005):
            sessions = list(self.engine.metrics()["sessions"])
            if sessions:
                slot = self.engine.subscribe(sessions[0], maxlen=4096)
        while slot is not None and not self._stop.is_set():
            frame = slot.get(timeout=0.1)
            if frame is not None:
                self.frames[frame.index] = frame.rgb

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(5)


@contextlib.contextmanager
def busy_processes(n: int):
    """``n`` processes spinning on a CPU core each (``--stress``), stopped on exit."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield procs
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


class _Server:
    """The app served in-process on a loopback port (uvicorn in a thread)."""

    def __init__(self, engine):
        import socket

        import uvicorn

        from worldstream.app.server import create_app

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._server = uvicorn.Server(uvicorn.Config(
            create_app(engine, ui=False), host="127.0.0.1", port=self.port, log_level="warning"))
        self._thread = threading.Thread(target=self._server.run, daemon=True)

    def __enter__(self):
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the benchmark server did not start")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc):
        self._server.should_exit = True
        self._thread.join(10)


def _markdown(payload: dict) -> str:
    from worldstream.bench.results import context_md, table

    r = payload["e2e"]
    lat = r["action_to_photon_ms"]
    dec = r["action_to_decoded_ms"]
    rows = [["action-to-photon p50 / p95 / p99 (ms, frame complete at the client)",
             f"{lat['p50'] or 0:.0f} / {lat['p95'] or 0:.0f} / {lat['p99'] or 0:.0f}"],
            ["action-to-decoded p50 / p95 (ms, + aiortc's one-frame hold)",
             f"{dec['p50'] or 0:.0f} / {dec['p95'] or 0:.0f}"],
            ["actions sent / measured", f"{r['actions_sent']} / {lat['count']}"],
            ["fps received", r["fps"]], ["frames received", r["frames_received"]],
            ["time to first photon (ms, offer -> first frame)", r["first_photon_ms"]],
            ["dropped frames", f"{r['dropped_frames']} of {r['frames_generated']}"],
            ["jitter std (ms)", r["jitter"]["std_ms"]],
            ["jitter p95 |dev| (ms)", r["jitter"]["p95_abs_dev_ms"]]]
    if "corrupted_frames" in r:
        rows += [["corrupted frames / checked",
                  f"{r['corrupted_frames']} / {r['frames_checked']}"],
                 ["PSNR decoded vs sent p5 / p50 (dB)",
                  f"{r['psnr_db_p5']:.1f} / {r['psnr_db_p50']:.1f}"]]
    rows += [[f"stage {k} (ms, p50)", v] for k, v in r["stages_ms"].items()]
    return ("# End to end: headless WebRTC client\n\n" + context_md(payload) + "\n"
            + table(["figure", "value"], rows))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench e2e", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    harness.add_common_args(parser)
    parser.add_argument("--url", default=None, help="a running server (default: serve here)")
    parser.add_argument("--model", choices=("builtin", "sim"), default="builtin",
                        help="backend of the in-process server")
    parser.add_argument("--seconds", type=float, default=None, help="default 20 (4 smoke)")
    parser.add_argument("--fps", type=int, default=None, help="session fps (server default)")
    parser.add_argument("--mode", choices=("responsive", "quality"), default="responsive",
                        help="the session's mode (engine.core.config.MODES; default responsive)")
    parser.add_argument("--steps", type=int, default=None,
                        help="denoising steps (default: the mode's)")
    parser.add_argument("--stress", type=int, default=0, metavar="N",
                        help="run N busy processes beside the server and client")
    parser.add_argument("--script", default=None, help="action script JSON")
    parser.add_argument("--prompt", default=harness.PROMPT)
    parser.add_argument("--no-compile", action="store_true",
                        help="builtin: the model eager (default: compiled, as `worldstream "
                             "play` runs it; --smoke never compiles)")
    parser.add_argument("--export", default=None,
                        help="latency-lab export path (default results/e2e/session.json)")
    args = parser.parse_args(argv)
    harness.apply_common_args(args)
    import os

    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    from worldstream.bench import plots, results
    from worldstream.bench.common import hardware_info

    seconds = args.seconds or (4.0 if args.smoke else 20.0)
    script = (json.loads(open(args.script).read()) if args.script
              else random_script(seconds))
    model, server_settings, sent = None, {"url": args.url}, None
    settings = {"mode": args.mode, **({"steps": args.steps} if args.steps else {})}
    client = {"seconds": seconds, "fps": args.fps, "prompt": args.prompt, "settings": settings}
    with busy_processes(args.stress):
        if args.url:
            log, session = asyncio.run(run_client(args.url, script, **client))
        else:
            from worldstream.engine.core.config import EngineConfig
            from worldstream.engine.core.engine import Engine

            if args.model == "sim":
                from worldstream.engine.core.registry import load_backend

                backend = load_backend("sim")
                model = {"name": "sim (ground-truth simulator)", "weights": "none",
                         "resolution": f"{backend.width}x{backend.height}"}
            else:
                models = harness.load_models(args.weights, smoke=args.smoke)
                backend = harness.make_generator(
                    models, max_states=4, compile=not (args.no_compile or args.smoke))
                model = models.describe()
            engine = Engine(backend, EngineConfig(mode=args.mode)).start()
            try:
                from worldstream.bench.streams import measure_ttff

                measure_ttff(engine, repeats=1, timeout_s=300)  # loads the text encoder
                with _Server(engine) as server, SentFrames(engine) as sent:
                    server_settings = {
                        "url": "in-process " + server.url, "backend": args.model,
                        "engine": f"EngineConfig(mode={args.mode!r}) (degradation on)",
                        "chunk_frames": engine.chunk_frames,
                        "steps": args.steps or engine.default_steps}
                    log, session = run_client_process(server.url, script, keep_pictures=True,
                                                      **client)
            finally:
                engine.stop()
    figures = analyse_log(log, session["fps"], sent=sent.frames if sent else None)
    payload = results.stamp_payload("e2e", {
        "hardware": hardware_info(), "model": model or {"name": "remote server"},
        "settings": {"seconds": seconds, "fps": session["fps"], "mode": args.mode,
                     "stress_processes": args.stress,
                     "actions": len(log.actions), "threads": args.threads, **server_settings,
                     "resolution": f"{session['width']}x{session['height']}"},
        "e2e": figures}, argv)
    export = to_export(log)
    lat = [e["t_photon_ms"] - e["t_action_ms"] for e in export if e["t_photon_ms"] is not None]
    folder = results.save("e2e", payload, _markdown(payload), {
        "action_to_photon": plots.latency_histogram(lat, "action-to-photon (headless WebRTC)"),
        "stages": plots.stage_bars(figures["stages_ms"], "path of a frame (p50 ms)")})
    with open(folder / "client_log.json", "w") as f:  # raw observations, for re-analysis
        json.dump({"actions": log.actions, "messages": log.messages, "frames": log.frames,
                   "errors": log.errors, "first_photon_ms": log.first_photon_ms}, f)
    export_path = args.export or str(folder / "session.json")
    with open(export_path, "w") as f:
        json.dump(export, f, indent=1)
    print(f"report: {folder / 'result.md'}; export: {export_path}", file=sys.stderr)
    results.print_json(payload, args.json)
    return 0
