"""Headless WebRTC viewers (aiortc) of the scale-out bench: each creates a session through the
front end's API, plays it (steering with random keys), and when its media stops for
``silence_s`` makes a new offer to the same session, as a page does whose media host went
away: the front end answers from wherever the session lives now.

    python -m worldstream.bench.cluster.viewers --url URL --sessions N --seconds S \\
        [--record 1] --out F.json

Prints ``ready`` on stdout once every session shows frames (the bench then acts: kills a
host, measures CPU); writes one JSON object: per session ``session_id``, ``frames``,
``arrivals`` (time.monotonic() of each frame: the machine's clock, comparable across
processes), ``reconnects``, ``recovered`` (events on the data channel), ``errors``; and for a
recorded session ``recording`` (``frames``, ``seconds``, ``max_pts_gap_s``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

#: no frame for this long: the media host is taken for gone and a new offer made, s
SILENCE_S = 0.6


class Viewer:
    """One session watched over WebRTC (see the module docstring)."""

    def __init__(self, http, index: int, *, record: bool, silence_s: float = SILENCE_S):
        self.http, self.index, self.record, self.silence_s = http, index, record, silence_s
        self.session: dict = {}
        self.arrivals: list[float] = []
        self.reconnects: list[float] = []
        self.recovered = 0
        self.errors: list[str] = []
        self.pc: Any = None
        self.channel: Any = None
        self._seq = 0

    @property
    def _auth(self) -> dict:
        return {"Authorization": f"Bearer {self.session['token']}"}

    async def create(self) -> None:
        reply = await self.http.post("/api/sessions", json={"prompt": f"scene {self.index}",
                                                            "seed": self.index})
        reply.raise_for_status()
        self.session = reply.json()

    async def connect(self, deadline: float):
        """A new peer connection to the session (the old one closed); its video track.
        Retries a 503 (the session is being moved) until ``deadline``."""
        from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription

        if self.pc is not None:
            await self.pc.close()
        while True:
            pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
            pc.addTransceiver("video", direction="recvonly")
            channel = pc.createDataChannel("control")
            channel.on("message", self._on_message)
            track = asyncio.get_running_loop().create_future()
            pc.on("track", lambda t, f=track: f.done() or f.set_result(t))
            await pc.setLocalDescription(await pc.createOffer())
            reply = await self.http.post(
                f"/api/sessions/{self.session['session_id']}/offer", headers=self._auth,
                json={"sdp": pc.localDescription.sdp, "type": "offer"})
            if reply.status_code == 200:
                await pc.setRemoteDescription(RTCSessionDescription(**reply.json()))
                self.pc, self.channel = pc, channel
                return await asyncio.wait_for(track, max(1.0, deadline - time.monotonic()))
            await pc.close()
            if reply.status_code != 503 or time.monotonic() > deadline:
                raise RuntimeError(f"offer refused: {reply.status_code} {reply.text}")
            await asyncio.sleep(0.1)

    def _on_message(self, raw) -> None:
        message = json.loads(raw)
        if message.get("type") == "event" and message.get("kind") == "recovered":
            self.recovered += 1
        elif message.get("type") == "error":
            self.errors.append(message.get("message", ""))

    def send(self, message: dict) -> None:
        if self.channel is not None and self.channel.readyState == "open":
            self._seq += 1
            self.channel.send(json.dumps({**message, "seq": self._seq}))

    async def play(self, until: list[float], ready: asyncio.Event) -> None:
        """Receive frames until ``until[0]`` (monotonic s; the caller moves it once every
        viewer is ready), reconnecting after a silence.

        NOTE: the loop ends on the clock, not on cancellation alone: Python 3.11's
        ``asyncio.wait_for`` drops a cancellation that arrives as the frame it waits for
        does, and a viewer so spared played on for a minute past the others, which made
        them look lost (the host-loss test's "regression")."""
        from aiortc.mediastreams import MediaStreamError

        rng = random.Random(self.index)
        track = await self.connect(until[0])
        recording, flowing = False, False  # flowing: this track has shown a frame
        while time.monotonic() < until[0]:
            try:
                await asyncio.wait_for(track.recv(), self.silence_s if flowing else 10.0)
            except (TimeoutError, MediaStreamError):
                self.reconnects.append(time.monotonic())
                flowing = False
                try:
                    track = await self.connect(until[0])
                except Exception as err:  # reported; the viewer goes on trying
                    self.errors.append(f"reconnect: {err!r}")
                continue
            flowing = True
            self.arrivals.append(time.monotonic())
            if len(self.arrivals) == 8:
                ready.set()
            if self.record and not recording and self.channel.readyState == "open":
                self.send({"type": "record", "on": True})
                recording = True
            if len(self.arrivals) % 8 == 0:
                keys = [rng.choice(["left", "right", "up", "down"])]
                self.send({"type": "action", "t": time.time() * 1e3, "keys": keys})

    async def finish(self) -> dict:
        out = {"session_id": self.session.get("session_id"), "frames": len(self.arrivals),
               "arrivals": [round(t, 4) for t in self.arrivals],
               "reconnects": [round(t, 4) for t in self.reconnects],
               "recovered": self.recovered, "errors": self.errors[:5]}
        if self.record and self.session:
            self.send({"type": "record", "on": False})
            await asyncio.sleep(1.0)
            out["recording"] = await self._recording()
        if self.pc is not None:
            await self.pc.close()
        if self.session:
            await self.http.delete(f"/api/sessions/{self.session['session_id']}",
                                   headers=self._auth)
        return out

    async def _recording(self) -> dict:
        import av

        reply = await self.http.get(
            f"/api/sessions/{self.session['session_id']}/recording.mp4", headers=self._auth)
        if reply.status_code != 200:
            return {"status": reply.status_code}
        path = Path(f"/tmp/ws-viewer-{os.getpid()}-{self.index}.mp4")
        path.write_bytes(reply.content)
        try:
            with av.open(str(path)) as container:
                stream = container.streams.video[0]
                pts = [float(f.pts * stream.time_base)  # type: ignore[operator]
                       for f in container.decode(video=0)]
        finally:
            path.unlink()
        gaps = [b - a for a, b in zip(pts, pts[1:])] or [0.0]
        return {"status": 200, "frames": len(pts),
                "seconds": round(pts[-1] - pts[0], 2) if pts else 0.0,
                "max_pts_gap_s": round(max(gaps), 3)}


async def watch(url: str, sessions: int, seconds: float, record: int = 0) -> list[dict]:
    """``sessions`` viewers for ``seconds`` after all of them show frames; the first
    ``record`` record."""
    import httpx

    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        viewers = [Viewer(http, i, record=i < record) for i in range(sessions)]
        for viewer in viewers:
            await viewer.create()
        readies = [asyncio.Event() for _ in viewers]
        until = [time.monotonic() + seconds + 60]  # moved once every viewer is ready
        tasks = [asyncio.ensure_future(v.play(until, r)) for v, r in zip(viewers, readies)]
        await asyncio.wait_for(asyncio.gather(*(r.wait() for r in readies)), 60)
        print("ready", flush=True)
        until[0] = time.monotonic() + seconds
        await asyncio.sleep(seconds)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return [await v.finish() for v in viewers]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--sessions", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--record", type=int, default=0, help="how many sessions record")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    results = asyncio.run(watch(args.url, args.sessions, args.seconds, args.record))
    Path(args.out).write_text(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
