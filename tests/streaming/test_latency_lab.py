"""Latency lab, server side: ``GET /api/sessions/{id}/frames.json`` over the real engine and the
``sim`` backend (tokens, the bounded ring, records equal to the frames the engine made and the
``frame`` headers the client got), and the frame log ring on its own."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import numpy as np
import pytest
import websockets

from tests.conftest import LiveServer
from worldstream.app.server import create_app
from worldstream.engine.core.api import Frame
from worldstream.streaming.framelog import FrameLog
from worldstream.streaming.limits import Limits
from worldstream.streaming.websocket import unpack_frame

RING = 8          # frames kept by the server under test
FRAMES = 14       # frames the client takes: more than the ring holds
ACTION_AT = 4     # the client presses "right" after this many frames
ACTION_T = 1234.5


def test_frame_log_ring_keeps_the_newest_records():
    log = FrameLog(capacity=3)
    rgb = np.zeros((2, 2, 3), np.uint8)
    for i in range(5):
        log.record(Frame("s", i, rgb, action_seq=i // 2, prompt_version=0, chunk_index=i // 2,
                         stages_ms={"denoise": float(i)}), rtp_ts=i * 4500,
                   queue_ms=None if i == 4 else 2.0)
    snap = log.snapshot()
    assert (snap["capacity"], snap["logged"], snap["evicted"]) == (3, 5, 2)
    assert [f["index"] for f in snap["frames"]] == [2, 3, 4]
    assert [f["rtp_ts"] for f in snap["frames"]] == [9000, 13500, 18000]
    assert snap["frames"][0]["stages_ms"] == {"denoise": 2.0}
    assert snap["frames"][1]["t_ready_ms"] == pytest.approx(snap["frames"][1]["t_sent_ms"] - 2.0)
    assert snap["frames"][2]["queue_ms"] is None and snap["frames"][2]["t_ready_ms"] is None
    with pytest.raises(ValueError):
        FrameLog(capacity=0)
    with pytest.raises(ValueError):
        Limits(frame_log_frames=0)


async def _stream(url: str, engine) -> dict:
    """Create a session, pull FRAMES frames over the WebSocket (one credit at a time, so the
    server sends exactly those), press a key on the way; returns everything seen."""
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        s = (await http.post("/api/sessions", json={"prompt": "a green meadow with ponds",
                                                    "seed": 3, "fps": 20})).json()
        # every frame the engine makes for the session, beside the transport's own slot
        engine_slot = engine.subscribe(s["session_id"], maxlen=512)
        ws_url = (url.replace("http", "ws")
                  + f"/api/sessions/{s['session_id']}/ws?token={s['token']}")
        headers = []
        t0_wall = time.time() * 1000
        async with websockets.connect(ws_url) as ws:
            while len(headers) < FRAMES:
                await ws.send('{"type":"next"}')
                while True:
                    raw = await asyncio.wait_for(ws.recv(), 60)
                    if not isinstance(raw, str):
                        break
                headers.append(unpack_frame(raw)[0])
                if len(headers) == ACTION_AT:
                    await ws.send(json.dumps({"type": "action", "seq": 7, "t": ACTION_T,
                                              "keys": ["right"]}))
            t1_wall = time.time() * 1000
            sid = s["session_id"]
            replies = {
                "bearer": await http.get(f"/api/sessions/{sid}/frames.json",
                                         headers={"Authorization": f"Bearer {s['token']}"}),
                "query": await http.get(f"/api/sessions/{sid}/frames.json",
                                        params={"token": s["token"]}),
                "none": await http.get(f"/api/sessions/{sid}/frames.json"),
                "wrong": await http.get(f"/api/sessions/{sid}/frames.json",
                                        headers={"Authorization": "Bearer nope"}),
                "unknown": await http.get("/api/sessions/nope/frames.json",
                                          params={"token": s["token"]}),
            }
        engine_frames = {}
        while (f := engine_slot.get_nowait()) is not None:
            engine_frames[f.index] = f
        await http.delete(f"/api/sessions/{sid}",
                          headers={"Authorization": f"Bearer {s['token']}"})
    return {"session": s, "headers": headers, "replies": replies, "engine": engine_frames,
            "t0": t0_wall, "t1": t1_wall}


@pytest.fixture(scope="module")
def streamed(sim_engine):
    app = create_app(sim_engine, Limits(frame_log_frames=RING), ui=False)
    with LiveServer(app) as server:
        return asyncio.run(_stream(server.url, sim_engine))


def test_frames_json_needs_the_session_token(streamed):
    r = streamed["replies"]
    assert r["bearer"].status_code == 200 and r["query"].status_code == 200
    # no credit was left: nothing was sent between the two requests
    assert r["bearer"].json() == r["query"].json()
    assert r["none"].status_code == 401 and r["none"].json()["field"] == "authorization"
    assert r["wrong"].status_code == 401
    assert r["unknown"].status_code == 404


def test_frames_json_keeps_the_last_frames_sent(streamed):
    body = streamed["replies"]["bearer"].json()
    assert body["session_id"] == streamed["session"]["session_id"] and body["fps"] == 20
    # one credit at a time: the server sent exactly the FRAMES frames the client received
    assert (body["capacity"], body["logged"], body["evicted"]) == (RING, FRAMES, FRAMES - RING)
    sent = [(h["index"], h["rtp_ts"]) for h in streamed["headers"][-RING:]]
    assert [(f["index"], f["rtp_ts"]) for f in body["frames"]] == sent


def test_frames_json_matches_the_frame_headers_and_the_engine(streamed):
    body = streamed["replies"]["bearer"].json()
    headers = {h["index"]: h for h in streamed["headers"]}
    engine = streamed["engine"]
    for rec in body["frames"]:
        header = headers[rec["index"]]
        for key in ("rtp_ts", "action_seq", "prompt_version", "chunk_index", "stages_ms",
                    "queue_ms"):
            assert rec[key] == header[key], (key, rec, header)
        assert rec["action_t"] == header.get("action_t")
        made = engine[rec["index"]]  # the engine's own Frame object, from another slot
        assert rec["stages_ms"] == pytest.approx(made.stages_ms)
        assert (rec["action_seq"], rec["chunk_index"], rec["prompt_version"]) == (
            made.action_seq, made.chunk_index, made.prompt_version)
        assert rec["action_t"] == made.action_t_ms
        assert streamed["t0"] <= rec["t_sent_ms"] <= streamed["t1"] + 1
        assert rec["t_ready_ms"] == pytest.approx(rec["t_sent_ms"] - rec["queue_ms"])
        assert rec["queue_ms"] >= 0 and rec["stages_ms"]
    # the key press reached the log: the newest frames answer action 7 and echo its time
    last = body["frames"][-1]
    assert (last["action_seq"], last["action_t"]) == (7, ACTION_T)
