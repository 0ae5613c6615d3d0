"""WebSocket fallback end to end: a ``websockets`` client against the real server, the real
engine and the ``sim`` backend."""

from __future__ import annotations

import asyncio
import io
import json
import time

import httpx
import numpy as np
import pytest
import websockets
from PIL import Image

from tests.conftest import LiveServer, phase_shift
from worldstream.app.server import create_app
from worldstream.engine.worlds.simulator import player_mask
from worldstream.streaming.websocket import pack_frame, unpack_frame

FPS = 20


def test_pack_unpack_round_trip():
    header = {"type": "frame", "index": 3, "rtp_ts": 13500}
    data = pack_frame(header, b"\xff\xd8jpeg")
    assert data[:4] == len(json.dumps(header)).to_bytes(4, "big")
    assert unpack_frame(data) == (header, b"\xff\xd8jpeg")
    with pytest.raises(ValueError):
        unpack_frame(data[:10])


async def _session(url: str, seed: int) -> tuple[dict, str]:
    """A new session on the live server: (creation reply, its WebSocket URL)."""
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        s = (await http.post("/api/sessions", json={"prompt": "a green meadow with ponds",
                                                    "seed": seed, "fps": FPS})).json()
    return s, url.replace("http", "ws") + f"/api/sessions/{s['session_id']}/ws?token={s['token']}"


async def _play(url: str, hold_after: int, total: int):
    _, ws_url = await _session(url, 11)
    frames, texts = [], []
    async with websockets.connect(ws_url) as ws:
        await ws.send('{"type":"next"}')
        while len(frames) < total:
            raw = await asyncio.wait_for(ws.recv(), 30)
            if isinstance(raw, str):
                texts.append(json.loads(raw))
                continue
            header, jpeg = unpack_frame(raw)
            frames.append((header, np.asarray(Image.open(io.BytesIO(jpeg)).convert("RGB"))))
            if len(frames) == hold_after:
                await ws.send(json.dumps({"type": "action", "seq": 1, "t": time.time() * 1e3,
                                          "keys": ["right"]}))
            await ws.send('{"type":"next"}')
    return frames, texts


@pytest.mark.slow
def test_websocket_stream_follows_hold_right(sim_engine):
    with LiveServer(create_app(sim_engine, ui=False)) as server:
        frames, texts = asyncio.run(_play(server.url, hold_after=30, total=75))
    headers = [h for h, _ in frames]
    ticks = [h["rtp_ts"] for h in headers]
    assert ticks[0] == 0 and all(b > a for a, b in zip(ticks, ticks[1:], strict=False))
    # paced by the engine's playout clock: one frame interval per frame while it keeps up
    assert abs(np.median(np.diff(ticks)) - 90_000 // FPS) <= 2
    assert all(h["type"] == "frame" and "stages_ms" in h for h in headers)
    assert frames[0][1].shape == (128, 128, 3)
    mask = player_mask()
    rgb = [f for _, f in frames]
    idle = [phase_shift(a, b, mask)[0] for a, b in zip(rgb[5:29], rgb[6:30], strict=False)]
    moving = [phase_shift(a, b, mask) for a, b in zip(rgb[-20:-1], rgb[-19:], strict=False)]
    assert np.median(np.abs(idle)) < 0.5, idle
    assert np.median([dx for dx, _ in moving]) < -2.0, moving
    assert np.median(np.abs([dy for _, dy in moving])) < 0.5
    assert headers[0]["action_seq"] == -1 and headers[-1]["action_seq"] == 1
    assert any(t["type"] == "stats" for t in texts)


async def _nested_then_ping(url: str) -> list[dict]:
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        s = (await http.post("/api/sessions", json={"prompt": "a green meadow with ponds"})).json()
    ws_url = url.replace("http", "ws") + f"/api/sessions/{s['session_id']}/ws?token={s['token']}"
    replies = []
    async with websockets.connect(ws_url) as ws:
        await ws.send("[" * 1100 + "]" * 1100)  # 2,200 bytes: under the size limit
        await ws.send('{"type":"ping","seq":7,"t":1}')
        while len(replies) < 2:
            msg = json.loads(await asyncio.wait_for(ws.recv(), 30))
            if msg["type"] in ("error", "pong"):
                replies.append(msg)
    return replies


def test_deeply_nested_json_gets_an_error_and_the_socket_lives(sim_engine):
    """Issue 12, item 6: 2 KB of nested brackets closed the WebSocket with a RecursionError."""
    with LiveServer(create_app(sim_engine, ui=False)) as server:
        error, pong = asyncio.run(_nested_then_ping(server.url))
    assert error["type"] == "error" and error["code"] == "malformed"
    assert pong["type"] == "pong" and pong["seq"] == 7


async def _stall_and_resume(url: str, stall_s: float):
    """Read 20 frames, stop asking for frames for ``stall_s``, then read 20 more. Returns the
    frame headers before and after the stall."""
    _, ws_url = await _session(url, 5)
    before, after = [], []
    async with websockets.connect(ws_url) as ws:
        async def read(into, n):
            while len(into) < n:
                await ws.send('{"type":"next"}')
                raw = await asyncio.wait_for(ws.recv(), 30)
                while isinstance(raw, str):
                    raw = await asyncio.wait_for(ws.recv(), 30)
                into.append(unpack_frame(raw)[0])
        await read(before, 20)
        await asyncio.sleep(stall_s)
        await read(after, 20)
    return before, after


@pytest.mark.slow
def test_slow_reader_gets_the_newest_frame_and_the_backlog_drains(sim_engine):
    """Latest wins: after a 2 s stall the reader's next frame is the newest one (no standing
    backlog of old frames), and the stream then runs on at the clock's pace."""
    with LiveServer(create_app(sim_engine, ui=False)) as server:
        before, after = asyncio.run(_stall_and_resume(server.url, 2.0))
    # during the stall ~40 frames were generated: the first frame after it skips them
    assert after[0]["index"] - before[-1]["index"] >= 30
    # and it was handed out fresh, not from a queue: ready -> sent within a few frame times
    assert np.median([h["queue_ms"] for h in after[2:]]) < 3 * 1e3 / FPS
    # consecutive frames after the stall: one index apart (nothing further piles up)
    assert np.median(np.diff([h["index"] for h in after])) == 1


async def _open_close_and_reject(url: str, sockets: int, offers: int) -> str:
    """Open and close ``sockets`` WebSockets on one session (each reads one frame), post
    ``offers`` offers without a video line (each refused); returns the session id."""
    s, ws_url = await _session(url, 2)
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        for _ in range(sockets):
            async with websockets.connect(ws_url) as ws:
                await ws.send('{"type":"next"}')
                while isinstance(await asyncio.wait_for(ws.recv(), 30), str):
                    pass
        sdp = "v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\ns=-\r\nt=0 0\r\n"
        for _ in range(offers):
            r = await http.post(f"/api/sessions/{s['session_id']}/offer",
                                json={"sdp": sdp, "type": "offer"},
                                headers={"Authorization": f"Bearer {s['token']}"})
            assert r.status_code == 400, r.text
    return s["session_id"]


@pytest.mark.slow
def test_closed_connections_and_refused_offers_stop_receiving_frames(sim_engine):
    """Issue 12, item 3: every slot a closed connection or a refused offer subscribed is
    dropped by the engine, so the session's drop counter stops growing."""
    with LiveServer(create_app(sim_engine, ui=False)) as server:
        sid = asyncio.run(_open_close_and_reject(server.url, sockets=5, offers=5))
        time.sleep(0.5)  # a chunk or two: the engine prunes closed slots as it delivers
        first = sim_engine.metrics()["sessions"][sid]
        time.sleep(1.0)
        later = sim_engine.metrics()["sessions"][sid]
    assert first["subscribers"] == 0 and later["subscribers"] == 0
    assert later["dropped_frames"] == first["dropped_frames"]
