"""WebSocket viewers for the front end's CPU measurement (``runs.frontend_cpu`` with
``transport="websocket"``), in a process of their own as the WebRTC ones
(``bench.cluster.viewers``): each makes a session, connects where the front end says the
session's WebSocket is (``GET /api/sessions/{id}/ws-url``; its own route when that is null, or
always with ``--route front``), pulls frames with two ``next`` credits in flight and notes each
arrival. Prints ``ready`` once every viewer has a frame; writes ``[{"arrivals": [s, ...],
"from": "replica"|"front"}]`` to ``--out``."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

CREDITS = 2


async def _view(http, url: str, route: str, ready: asyncio.Event, until: list[float]) -> dict:
    import websockets

    created = (await http.post("/api/sessions", json={"prompt": "a meadow"})).json()
    sid, token = created["session_id"], created["token"]
    ws_url = None
    if route == "auto":
        reply = await http.get(f"/api/sessions/{sid}/ws-url",
                               headers={"Authorization": f"Bearer {token}"})
        ws_url = reply.json()["ws_url"]
    ws_url = ws_url or url.replace("http", "ws", 1) + f"/api/sessions/{sid}/ws"
    arrivals: list[float] = []
    async with websockets.connect(f"{ws_url}?token={token}", max_size=None) as ws:
        for _ in range(CREDITS):
            await ws.send('{"type":"next"}')
        while not until or time.monotonic() < until[0]:
            message = await ws.recv()
            if isinstance(message, bytes):
                arrivals.append(time.monotonic())
                ready.set()
                await ws.send('{"type":"next"}')
    await http.delete(f"/api/sessions/{sid}", headers={"Authorization": f"Bearer {token}"})
    return {"arrivals": arrivals, "from": "front" if ws_url.startswith(url.replace(
        "http", "ws", 1)) else "replica"}


async def watch(url: str, sessions: int, seconds: float, route: str) -> list[dict]:
    """``sessions`` WebSocket viewers for ``seconds`` after all of them have a frame."""
    import httpx

    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        readies = [asyncio.Event() for _ in range(sessions)]
        until: list[float] = []
        tasks = [asyncio.ensure_future(_view(http, url, route, r, until)) for r in readies]
        await asyncio.wait_for(asyncio.gather(*(r.wait() for r in readies)), 60)
        print("ready", flush=True)
        until.append(time.monotonic() + seconds)
        return list(await asyncio.gather(*tasks))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--sessions", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--record", type=int, default=0, help="ignored (WebRTC viewers only)")
    parser.add_argument("--route", choices=("auto", "front"), default="auto")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    results = asyncio.run(watch(args.url, args.sessions, args.seconds, args.route))
    Path(args.out).write_text(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
