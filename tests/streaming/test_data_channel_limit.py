"""Oversized data-channel messages (issue 57, item 2): the answer advertises the application's
limit (``a=max-message-size``), and a client ignoring it has its association aborted at the
first fragment past the limit, instead of the server reassembling the whole message first."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription

from tests.conftest import LiveServer
from worldstream.app.server import create_app
from worldstream.streaming.messages import MAX_MESSAGE_BYTES
from worldstream.streaming.sctp import BoundedSctpTransport


async def _connect(http: httpx.AsyncClient):
    """A session and a client peer connection whose ``control`` channel is open; returns
    (session, pc, channel, answer SDP, received messages)."""
    s = (await http.post("/api/sessions", json={"prompt": "a green meadow"})).json()
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    pc.addTransceiver("video", direction="recvonly")
    channel = pc.createDataChannel("control")
    loop = asyncio.get_running_loop()
    opened, received = loop.create_future(), asyncio.Queue()
    channel.on("open", lambda: opened.set_result(True))
    channel.on("message", lambda raw: received.put_nowait(json.loads(raw)))
    await pc.setLocalDescription(await pc.createOffer())
    r = await http.post(f"/api/sessions/{s['session_id']}/offer",
                        headers={"Authorization": f"Bearer {s['token']}"},
                        json={"sdp": pc.localDescription.sdp, "type": "offer"})
    assert r.status_code == 200, r.text
    await pc.setRemoteDescription(RTCSessionDescription(**r.json()))
    await asyncio.wait_for(opened, 20)
    return s, pc, channel, r.json()["sdp"], received


async def _reply(received: asyncio.Queue, kind: str, seq: int) -> dict:
    while True:
        message = await asyncio.wait_for(received.get(), 10)
        if message["type"] == kind and message.get("seq") == seq:
            return message


async def _oversized(url: str, server_pcs: dict) -> dict:
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        s, pc, channel, answer, received = await _connect(http)
        limit = [line for line in answer.splitlines() if line.startswith("a=max-message-size:")]
        # a message of exactly the limit, in four fragments, is delivered and answered
        ping = '{"type":"ping","seq":1,"t":1}'
        channel.send(ping[:-1] + " " * (MAX_MESSAGE_BYTES - len(ping)) + "}")
        pong = await _reply(received, "pong", 1)
        # the failing input: 8 MB, sent by a client that ignores the advertised size
        pc.sctp._remote_max_message_size = 0  # aiortc's own check (a browser's send() throws)
        closed = asyncio.get_running_loop().create_future()
        channel.on("close", lambda: closed.done() or closed.set_result(True))
        t0 = time.monotonic()
        channel.send(json.dumps({"type": "ping", "seq": 2, "t": 1, "pad": "x" * 8_000_000}))
        await asyncio.wait_for(closed, 10)
        aborted_s = time.monotonic() - t0
        (server_pc,) = [p for p, peer in server_pcs.items()
                        if peer.session.session_id == s["session_id"]]
        sctp = server_pc.sctp
        still = server_pc.connectionState
        # the session goes on until its client deletes it
        r = await http.delete(f"/api/sessions/{s['session_id']}",
                              headers={"Authorization": f"Bearer {s['token']}"})
        await pc.close()
    return {"limit": limit, "pong": pong, "aborted_s": aborted_s, "sctp": sctp,
            "state": still, "deleted": r.status_code}


def test_oversized_message_aborts_the_association_without_buffering(fake_engine):
    app = create_app(fake_engine, ui=False)
    with LiveServer(app) as server:
        got = asyncio.run(_oversized(server.url, app.state.webrtc._pcs))
    assert got["limit"] == [f"a=max-message-size:{MAX_MESSAGE_BYTES}"]
    assert got["pong"]["type"] == "pong"
    assert isinstance(got["sctp"], BoundedSctpTransport) and got["sctp"].refused
    assert not got["sctp"]._inbound_streams  # nothing of the message kept
    assert got["aborted_s"] < 3.0, got["aborted_s"]
    assert got["state"] == "connected"  # the video goes on
    assert got["deleted"] == 204
