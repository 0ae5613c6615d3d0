"""The ``oversized`` phase of ``python -m bench soak --adversarial`` (issue 57, item 2): clients
that send 8 MB data-channel messages, ignoring the ``a=max-message-size`` the server advertises
(as a modified client can; a browser's ``send()`` refuses), while a normal session streams.

Each client holds a session of its own and, in a loop: connects over WebRTC, sends one message
of ``--oversized-mb`` MB on the ``control`` channel, waits for the server to refuse it (the
channel closes when the association is aborted; 10 s at most), closes its peer connection and
starts again after ``--oversized-period-s``. On a server of its own, for
``--oversized-seconds`` each: the normal session alone (the fps reference), then beside a
``crowd`` of the same clients sending 1 KB messages instead (what their sessions and
reconnections cost the server: memory that any client would cost), then beside the
``oversized`` clients. The server's resident memory is sampled every 0.5 s. Goals: the
oversized phase's RSS growth (its peak minus its start) <= 50 MB; the normal session keeps
>= 90 % of its fps alone.
"""

from __future__ import annotations

import asyncio
import threading
import time

#: what a well-behaved client of the crowd sends instead
CROWD_MESSAGE_BYTES = 1024


async def _client(url: str, seconds: float, message_bytes: int, period_s: float) -> dict:
    import httpx
    from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription

    got = {"messages": 0, "refused": 0, "connections": 0, "offers_refused": 0,
           "advertised": None}
    payload = b"x" * message_bytes
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        s = (await http.post("/api/sessions", json={"prompt": "a snowy forest"})).json()
        auth = {"Authorization": f"Bearer {s['token']}"}
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
            pc.addTransceiver("video", direction="recvonly")
            channel = pc.createDataChannel("control")
            loop = asyncio.get_running_loop()
            opened, closed = loop.create_future(), loop.create_future()
            channel.on("open", lambda f=opened: f.done() or f.set_result(True))
            channel.on("close", lambda f=closed: f.done() or f.set_result(True))
            await pc.setLocalDescription(await pc.createOffer())
            r = await http.post(f"/api/sessions/{s['session_id']}/offer", headers=auth,
                                json={"sdp": pc.localDescription.sdp, "type": "offer"})
            try:
                if r.status_code != 200:
                    got["offers_refused"] += 1
                    continue
                got["advertised"] = next((int(line.split(":")[1]) for line in
                                          r.json()["sdp"].splitlines()
                                          if line.startswith("a=max-message-size:")), None)
                await pc.setRemoteDescription(RTCSessionDescription(**r.json()))
                await asyncio.wait_for(opened, 20)
                got["connections"] += 1
                pc.sctp._remote_max_message_size = 0  # ignore what the server advertised
                channel.send(payload)
                got["messages"] += 1
                # a refusal closes the channel; a message within the limit is not refused
                await asyncio.wait_for(closed, 10 if message_bytes > got["advertised"] else 0.05)
                got["refused"] += 1
            except TimeoutError:
                pass
            finally:
                await pc.close()
                await asyncio.sleep(period_s)
        await http.delete(f"/api/sessions/{s['session_id']}", headers=auth)
    return got


async def flood(url: str, clients: int, seconds: float, message_mb: float,
                period_s: float) -> dict:
    """``clients`` clients sending ``message_mb`` MB messages for ``seconds``; their counts
    summed."""
    results = await asyncio.gather(*(_client(url, seconds, int(message_mb * 2**20), period_s)
                                     for _ in range(clients)))
    total = {k: sum(r[k] for r in results) for k in ("messages", "refused", "connections",
                                                     "offers_refused")}
    return {**total, "clients": clients, "message_mb": message_mb,
            "advertised": results[0]["advertised"]}


class RssSampler:
    """Samples the resident memory of process ``pid`` every ``period_s`` in a thread."""

    def __init__(self, pid: int, period_s: float = 0.5):
        from worldstream.bench.adversarial import server_rss_mib

        self._read, self._pid, self._period = server_rss_mib, pid, period_s
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append(self._read(self._pid))
            self._stop.wait(self._period)

    def __enter__(self) -> RssSampler:
        self.start = self._read(self._pid)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.end = self._read(self._pid)

    def summary(self) -> dict:
        peak = max(self.samples, default=self.start)
        return {"rss_start_mib": round(self.start, 1), "rss_peak_mib": round(peak, 1),
                "rss_end_mib": round(self.end, 1), "growth_mib": round(peak - self.start, 1),
                "every_10s_mib": [round(v, 1) for v in self.samples[::20]]}


def run(args) -> dict:
    """The phase on a ``worldstream play`` server of its own (``--oversized-clients`` + 2
    sessions): the normal session alone, beside the crowd, beside the oversized clients."""
    from worldstream.bench.adversarial import PlayServer, phase

    seconds = args.oversized_seconds
    options = {"clients": args.oversized_clients, "period_s": args.oversized_period_s}
    with PlayServer(args.model, 2 + args.oversized_clients, args.threads) as server:
        phase(server.url, None, 3, seed=99)  # warm-up
        reference = phase(server.url, None, seconds, seed=7)
        with RssSampler(server.proc.pid) as crowd_rss:
            crowd = phase(server.url, "oversized", seconds, 7,
                          {**options, "message_mb": CROWD_MESSAGE_BYTES / 2**20})
        with RssSampler(server.proc.pid) as rss:
            result = phase(server.url, "oversized", seconds, 7,
                           {**options, "message_mb": args.oversized_mb})
    return {**result, "alone_fps": reference["fps"], "alone_p95_ms": reference["a2p_p95_ms"],
            "rss": rss.summary(),
            "crowd": {"fps": crowd["fps"], "adversary": crowd["adversary"],
                      "rss": crowd_rss.summary()}}


def summary(p: dict) -> str:
    """One paragraph of the report on phase ``p``."""
    a, rss, crowd = p["adversary"], p["rss"], p["crowd"]
    return (f"Oversized messages: {a['clients']} clients, {a['message_mb']} MB each, "
            f"{a['messages']} sent, {a['refused']} refused as they arrived (max-message-size "
            f"advertised: {a['advertised']}). Server RSS {rss['rss_start_mib']} MiB at the "
            f"start, peak {rss['rss_peak_mib']} ({rss['growth_mib']:+.1f} MiB), "
            f"{rss['rss_end_mib']} at the end; the same clients sending 1 KB before it (their "
            f"sessions and reconnections): {crowd['rss']['growth_mib']:+.1f} MiB. The normal "
            f"session: {p['fps']:.1f} fps beside them, {crowd['fps']:.1f} beside the crowd, "
            f"{p['alone_fps']:.1f} alone on the same server.")
