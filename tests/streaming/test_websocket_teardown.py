"""The WebSocket of a deleted session closes (issue 64, item 5): a client that never sends
``next`` (so never asks its slot for a frame) still gets the protocol's close within 2 s of
the DELETE, after the session's ``closed`` event; and one client address holds a bounded
number of WebSockets over all its sessions (429 past it, room again once one closes). A
``websockets`` client against the real server, engine and ``sim`` backend."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import websockets

from tests.conftest import LiveServer
from worldstream.app.server import create_app
from worldstream.streaming.limits import Limits
from worldstream.streaming.websocket import SESSION_ENDED_CODE, SESSION_ENDED_REASON

SOCKETS = 3


async def _session(http: httpx.AsyncClient) -> tuple[str, dict, str]:
    """A new session's id, bearer header and WebSocket URL."""
    s = (await http.post("/api/sessions", json={"prompt": "a green meadow with ponds"})).json()
    ws_url = (str(http.base_url).replace("http", "ws").rstrip("/")
              + f"/api/sessions/{s['session_id']}/ws?token={s['token']}")
    return s["session_id"], {"Authorization": f"Bearer {s['token']}"}, ws_url


async def _until_closed(ws, timeout_s: float) -> tuple[float, list[dict]]:
    """Seconds until ``ws`` is closed by the server (within ``timeout_s``) and the text
    messages seen meanwhile; the client sends nothing (no ``next``: no credit)."""
    start, texts = time.monotonic(), []
    try:
        while True:
            message = await asyncio.wait_for(ws.recv(), timeout_s - (time.monotonic() - start))
            if isinstance(message, str):
                texts.append(json.loads(message))
    except websockets.ConnectionClosed:
        return time.monotonic() - start, texts


def test_a_deleted_session_s_socket_without_credit_closes_within_2_s(sim_engine):
    async def run() -> list[tuple[float, list[dict], tuple]]:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
            sessions = [await _session(http) for _ in range(SOCKETS)]
            sockets = [await websockets.connect(url) for _, _, url in sessions]
            await asyncio.sleep(1.2)  # a stats message or two: the sockets are served
            for sid, auth, _ in sessions:
                assert (await http.delete(f"/api/sessions/{sid}", headers=auth)
                        ).status_code == 204
            results = await asyncio.gather(*(_until_closed(ws, 2.0) for ws in sockets))
            return [(dt, texts, (ws.close_code, ws.close_reason))
                    for (dt, texts), ws in zip(results, sockets, strict=True)]

    with LiveServer(create_app(sim_engine, ui=False)) as server:
        results = asyncio.run(run())
        manager = server._server.config.app.state.manager
        assert len(manager) == 0 and not manager._websockets  # nothing left counted
    for seconds, texts, close in results:
        assert seconds < 2.0
        assert close == (SESSION_ENDED_CODE, SESSION_ENDED_REASON)
        assert {"type": "event", "kind": "closed"} in texts  # before the close
        assert not any(t["type"] == "frame" for t in texts)  # no credit: no frame


def test_websockets_per_client_are_bounded_over_its_sessions(sim_engine):
    async def status(url: str) -> int:
        try:
            async with websockets.connect(url):
                return 101
        except websockets.InvalidStatus as refused:
            return refused.response.status_code

    async def run() -> None:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
            (_, _, a), (_, _, b) = await _session(http), await _session(http)
            first = await websockets.connect(a)
            second = await websockets.connect(b)
            assert await status(a) == 429  # a third socket of this address, any session
            await first.close()
            await asyncio.sleep(0.3)  # the server's side of the close
            assert await status(a) == 101  # room again
            await second.close()

    limits = Limits(websockets_per_client=2)
    with LiveServer(create_app(sim_engine, limits, ui=False)) as server:
        asyncio.run(run())
