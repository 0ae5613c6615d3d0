"""``python -m bench robustness <bodies|fps> [args]``: issue 74's numbers on a real
``worldstream play`` server (a process of its own, loopback; crafter by default).

- ``bodies``: the server's resident memory (VmRSS) idle, then its peak while a client sends a
  1 GiB chunked body to ``POST /api/sessions`` (as fast as the socket takes it), and while 20
  clients of one session each upload a 128 MiB save point slowly (declared length, 2 MiB/s).
  Goal: <= +64 MB over idle, or refused.
- ``fps``: one session streamed over its WebSocket (two ``next`` credits in flight) alone,
  then while a second client (a) loads the server's own save point 16 times at once, (b)
  forks its session again and again, (c) creates and deletes sessions in a loop. Goal: the
  streamed session keeps >= 90 % of its fps alone in each phase.

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import threading
import time

from worldstream.bench.adversarial import PlayServer, server_rss_mib


def _auth(s: dict) -> dict:
    return {"Authorization": f"Bearer {s['token']}"}


class _Peak:
    """The server's peak RSS, sampled every 0.1 s while in a ``with``."""

    def __init__(self, pid: int):
        self.pid, self.peak, self._stop = pid, 0.0, threading.Event()

    def __enter__(self) -> _Peak:
        def sample() -> None:
            while not self._stop.is_set():
                self.peak = max(self.peak, server_rss_mib(self.pid))
                time.sleep(0.1)

        self._thread = threading.Thread(target=sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def _send(port: int, head: bytes, chunks, stop: threading.Event) -> str:
    """Send ``head`` then ``chunks`` on a raw socket until refused; the status line seen."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(head)
        sock.settimeout(0.0)
        try:
            for chunk in chunks:
                if stop.is_set():
                    break
                try:
                    reply = sock.recv(256)
                    if reply:
                        return reply.split(b"\r\n")[0].decode()
                except BlockingIOError:
                    pass
                sock.settimeout(30)
                sock.sendall(chunk)
                sock.settimeout(0.0)
        except OSError as err:  # the server closed on us: refused
            return f"closed ({type(err).__name__})"
        sock.settimeout(30)
        try:
            return sock.recv(256).split(b"\r\n")[0].decode() or "closed"
        except OSError as err:
            return f"closed ({type(err).__name__})"


def bodies(server: PlayServer) -> dict:
    import httpx

    time.sleep(2.0)
    idle = server_rss_mib(server.proc.pid)
    stop = threading.Event()
    mib = b"x" * 2**20
    chunked = (b"%x\r\n%s\r\n" % (len(mib), mib) for _ in range(1024))
    head = (b"POST /api/sessions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
            b"application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
    with _Peak(server.proc.pid) as big:
        status_big = _send(server.port, head, chunked, stop)
    s = httpx.post(f"{server.url}/api/sessions", json={"prompt": "play"}).json()
    path = f"/api/sessions/{s['session_id']}/state"

    def upload(out: list) -> None:
        slow = (time.sleep(0.5) or bytes(2**20) for _ in range(128))
        head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer "
                f"{s['token']}\r\nContent-Type: application/octet-stream\r\n"
                f"Content-Length: {128 * 2**20}\r\n\r\n").encode()
        out.append(_send(server.port, head, slow, stop))

    statuses: list[str] = []
    with _Peak(server.proc.pid) as uploads:
        threads = [threading.Thread(target=upload, args=(statuses,)) for _ in range(20)]
        for t in threads:
            t.start()
        time.sleep(20)
        stop.set()
        for t in threads:
            t.join()
    return {"rss_idle_mib": round(idle, 1),
            "chunked_1gib": {"status": status_big, "peak_over_idle_mib":
                             round(big.peak - idle, 1)},
            "uploads_20x128mib": {"statuses": sorted(set(statuses)),
                                  "refused": sum("200" not in x for x in statuses),
                                  "peak_over_idle_mib": round(uploads.peak - idle, 1)}}


async def fps(server: PlayServer, alone: float, seconds: float) -> dict:
    import httpx
    import websockets

    url = server.url
    async with httpx.AsyncClient(base_url=url, timeout=120) as http:
        viewer = (await http.post("/api/sessions", json={"prompt": "play"})).json()
        other = (await http.post("/api/sessions", json={"prompt": "play"})).json()
        ws = url.replace("http", "ws", 1) + "/api/sessions/{}/ws?token={}"
        arrivals: list[float] = []

        async def view(socket, arrived: list[float]) -> None:
            for _ in range(2):
                await socket.send('{"type":"next"}')
            while True:
                if isinstance(await socket.recv(), bytes):
                    arrived.append(time.monotonic())
                    await socket.send('{"type":"next"}')

        async with websockets.connect(ws.format(viewer["session_id"], viewer["token"]),
                                      max_size=None) as a, \
                websockets.connect(ws.format(other["session_id"], other["token"]),
                                   max_size=None) as b:
            tasks = [asyncio.ensure_future(view(a, arrivals)),
                     asyncio.ensure_future(view(b, []))]
            await asyncio.sleep(3.0)
            save = (await http.get(f"/api/sessions/{other['session_id']}/state",
                                   headers=_auth(other))).content
            phases: dict[str, tuple[float, float, list]] = {}

            async def phase(name: str, work) -> None:
                t0, codes = time.monotonic(), []
                while time.monotonic() < t0 + seconds:
                    codes += await work()
                phases[name] = (t0, time.monotonic(), codes)

            async def loads() -> list:
                rs = await asyncio.gather(*(http.post(
                    f"/api/sessions/{other['session_id']}/state", content=save,
                    headers={**_auth(other), "Content-Type": "application/octet-stream"})
                    for _ in range(16)))
                return [r.status_code for r in rs]

            seq = [0]

            async def forks() -> list:
                seq[0] += 1
                await b.send(json.dumps({"type": "fork", "seq": seq[0], "k": 2}))
                await asyncio.sleep(1.0)
                return [0]

            async def creations() -> list:
                r = await http.post("/api/sessions", json={"prompt": "play"})
                if r.status_code == 201:
                    await http.delete(f"/api/sessions/{r.json()['session_id']}",
                                      headers=_auth(r.json()))
                else:
                    await asyncio.sleep(0.2)
                return [r.status_code]

            start = time.monotonic()
            await asyncio.sleep(alone)
            phases["alone"] = (start, time.monotonic(), [])
            for name, work in (("loads_16_at_once", loads), ("forks", forks),
                               ("create_delete", creations)):
                await phase(name, work)
            for task in tasks:
                task.cancel()

    def rate(t0: float, t1: float) -> float:
        return sum(t0 <= t < t1 for t in arrivals) / (t1 - t0)

    ref = rate(*phases["alone"][:2])
    out = {"fps_alone": round(ref, 2)}
    for name, (t0, t1, codes) in phases.items():
        if name != "alone":
            out[name] = {"fps": round(rate(t0, t1), 2), "ratio": round(rate(t0, t1) / ref, 3),
                         "statuses": sorted(set(codes))}
    out["loadavg"] = [round(x, 2) for x in os.getloadavg()]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench robustness",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("measure", choices=("bodies", "fps"))
    parser.add_argument("--env", default="CrafterReward-v1", help="the game served")
    parser.add_argument("--alone", type=float, default=15.0, help="fps: seconds alone first")
    parser.add_argument("--seconds", type=float, default=20.0, help="fps: seconds per phase")
    parser.add_argument("--threads", type=int, default=1, help="the server's OMP threads")
    args = parser.parse_args(argv)
    with PlayServer(None, 4, args.threads, extra=["--env", args.env]) as server:
        if args.measure == "bodies":
            result = bodies(server)
        else:
            result = asyncio.run(fps(server, args.alone, args.seconds))
    print(json.dumps({"measure": args.measure, "env": args.env, **result}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
