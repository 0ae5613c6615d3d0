"""The headless WebRTC client of ``bench e2e`` (``PROTOCOL.md``: one recvonly video
transceiver, a ``control`` data channel): opens a session, replays an action script, and logs
every action sent, frame message and decoded frame on its own clock, in a process of its own.

NOTE: aiortc's receiver hands a frame to its decoder only when the *next* frame's first packet
arrives (``aiortc/jitterbuffer.py``: a frame is complete when the timestamp changes; browsers
use the RTP marker bit), one frame interval later. The client therefore notes when each frame's
marker packet arrives (a wrapper around the receiver's private ``_handle_rtp_packet``: aiortc
has no public packet hook).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass, field


def random_script(seconds: float, seed: int = 0) -> list[dict]:
    """Key changes at random moments (every 0.3-1.0 s) for ``seconds``."""
    from worldstream.bench.streams import KEY_SETS

    rng = random.Random(seed)
    t, script = 0.5, []
    while t < seconds:
        script.append({"t_s": round(t, 3), "keys": rng.choice(KEY_SETS)})
        t += rng.uniform(0.3, 1.0)
    return script


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
