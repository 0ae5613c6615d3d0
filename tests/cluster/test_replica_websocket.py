"""The WebSocket fallback from the host that generates the session (issue 55): the front end
names the replica's WebSocket (``GET /api/sessions/{id}/ws-url``); a client connects there with
the session's token, gets frames, steers the session; a missing or wrong token, or a foreign
page's origin, is refused; the front end's own route still works; a killed replica's socket
closes, and the URL asked again leads to the new replica, which says ``recovered``; the page
(headless Chromium) does the same by itself, and uses the front end's route when the replica's
URL does not connect. A local Ray with two emulated replicas, started and stopped here."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import os
import signal
import socket
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
import websockets

from tests.fixtures.browser import CHROMIUM, CHROMIUM_ARGS
from worldstream.streaming.websocket import unpack_frame

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow


async def _session(http: httpx.AsyncClient) -> tuple[str, str, dict]:
    """A new session's id, token and bearer header."""
    created = (await http.post("/api/sessions", json={"prompt": "a meadow"})).json()
    token = created["token"]
    return created["session_id"], token, {"Authorization": f"Bearer {token}"}


async def _ws_url(http: httpx.AsyncClient, sid: str, token: str) -> str:
    """The replica's URL, asked until the session has a live replica (503 while it moves)."""
    for _ in range(100):
        reply = await http.get(f"/api/sessions/{sid}/ws-url",
                               headers={"Authorization": f"Bearer {token}"})
        if reply.status_code != 503:
            assert reply.status_code == 200, reply.text
            return reply.json()["ws_url"]
        await asyncio.sleep(0.2)
    raise AssertionError("the session never got a live replica")


async def _frames(ws, n: int, act: dict | None = None) -> tuple[list[dict], list[dict]]:
    """``n`` frame headers (pulling with ``next``) and the text messages seen meanwhile."""
    headers, texts = [], []
    await ws.send('{"type":"next"}')
    await ws.send('{"type":"next"}')
    if act is not None:
        await ws.send(json.dumps(act))
    while len(headers) < n:
        message = await asyncio.wait_for(ws.recv(), 10)
        if isinstance(message, str):
            texts.append(json.loads(message))
            continue
        header, jpeg = unpack_frame(message)
        assert jpeg[:2] == b"\xff\xd8"  # a JPEG, encoded on the replica's host
        headers.append(header)
        await ws.send('{"type":"next"}')
    return headers, texts


async def _refused(url: str, **kwargs) -> int:
    with pytest.raises(websockets.InvalidStatus) as refused:
        async with websockets.connect(url, **kwargs):
            pass
    return refused.value.response.status_code


def test_the_replica_serves_the_websocket_and_the_front_end_route_still_works(media_cluster):
    engine, server = media_cluster

    async def run() -> None:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
            sid, token, auth = await _session(http)
            url = await _ws_url(http, sid, token)
            replica = next(r for r in engine.metrics()["replicas"] if sid in r["sessions"])
            assert urlsplit(url).hostname == replica["host"]  # the replica's host
            assert urlsplit(url).port != urlsplit(server.url).port
            async with websockets.connect(f"{url}?token={token}",
                                          origin=server.url) as ws:  # the page's origin
                action = {"type": "action", "seq": 7, "t": 1.0, "keys": ["up"]}
                headers, _ = await _frames(ws, 24, action)
                assert headers[-1]["action_seq"] == 7  # the action reached the session
                assert [h["index"] for h in headers] == sorted({h["index"] for h in headers})
                routed = engine._sessions[sid]
                assert routed.forwarding is False  # no frame crossed to the front end
                manager = server._server.config.app.state.manager
                assert next(s for s in manager.sessions() if s.session_id == sid
                            ).transports == 1  # the replica told the front end
            assert routed.journal.replay()  # its steering reached the failover journal too
            assert await _refused(url) == 401
            assert await _refused(f"{url}?token=wrong") == 401
            assert await _refused(f"{url}?token={token}", origin="http://evil.example") == 403
            reply = await http.get(f"/api/sessions/{sid}/ws-url")
            assert reply.status_code == 401
            front = server.url.replace("http", "ws") + f"/api/sessions/{sid}/ws?token={token}"
            async with websockets.connect(front) as ws:  # the front end's route, unchanged
                headers, _ = await _frames(ws, 8)
                assert headers[-1]["action_seq"] == 7
            await http.delete(f"/api/sessions/{sid}", headers=auth)

    asyncio.run(run())


def _tcp_listeners(root_pid: int) -> list[tuple[str, int, str]]:
    """``(address, port, process name)`` of every listening TCP socket of ``root_pid`` and its
    descendants (here: the front end, Ray's head, raylet and workers), from ``/proc``."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        with contextlib.suppress(OSError):
            if entry.isdigit():
                stat = Path(f"/proc/{entry}/stat").read_text()
                children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(
                    int(entry))
    tree, todo = set(), [root_pid]
    while todo:
        tree.add(pid := todo.pop())
        todo += children.get(pid, [])
    listening = {}
    for table, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A":  # LISTEN
                ip, port = fields[1].split(":")
                raw = bytes.fromhex(ip)  # 32-bit words in host (little-endian) order
                raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
                listening[int(fields[9])] = (socket.inet_ntop(family, raw), int(port, 16))
    found = []
    for pid in tree:
        with contextlib.suppress(OSError):
            name = Path(f"/proc/{pid}/comm").read_text().strip()
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    link = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if link.startswith("socket:[") and int(link[8:-1]) in listening:
                        found.append((*listening[int(link[8:-1])], name))
    return found


def _loopback(address: str) -> bool:
    return ipaddress.ip_address(address.removeprefix("::ffff:")).is_loopback


def test_a_local_cluster_listens_on_loopback_and_deleted_sessions_close_here(media_cluster):
    """Issue 64: a Ray started by the front end (its head, raylet, workers) and the replicas'
    WebSocket servers listen on loopback only; a DELETE at the front end closes the session's
    socket on its replica within 2 s, with the protocol's close, for a client holding no
    ``next`` credit."""
    from worldstream.streaming.websocket import SESSION_ENDED_CODE, SESSION_ENDED_REASON

    _, server = media_cluster

    async def run() -> tuple[list, float, tuple]:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
            opened = []
            for _ in range(2):  # two sessions: most often one on each replica
                sid, token, auth = await _session(http)
                url = await _ws_url(http, sid, token)
                opened.append((auth, sid, await websockets.connect(f"{url}?token={token}")))
            listeners = _tcp_listeners(os.getpid())
            await asyncio.sleep(1.2)  # served: stats, no frame asked for
            auth, sid, ws = opened[0]
            start = time.monotonic()
            await http.delete(f"/api/sessions/{sid}", headers=auth)
            with contextlib.suppress(websockets.ConnectionClosed):
                while True:
                    await asyncio.wait_for(ws.recv(), 2.0)
            seconds = time.monotonic() - start
            auth, sid, ws = opened[1]
            await ws.close()
            await http.delete(f"/api/sessions/{sid}", headers=auth)
            return listeners, seconds, (opened[0][2].close_code, opened[0][2].close_reason)

    listeners, seconds, close = asyncio.run(run())
    names = {name for _, _, name in listeners}
    assert {"gcs_server", "raylet"} <= names and len(listeners) >= 6, listeners
    assert [x for x in listeners if not _loopback(x[0])] == []
    assert seconds < 2.0 and close == (SESSION_ENDED_CODE, SESSION_ENDED_REASON)


def test_a_killed_replica_s_websocket_reconnects_to_the_new_one_and_is_told(media_cluster):
    engine, server = media_cluster

    async def run() -> None:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
            sid, token, auth = await _session(http)
            url = await _ws_url(http, sid, token)
            async with websockets.connect(f"{url}?token={token}") as ws:
                before, _ = await _frames(ws, 8)
                replica = next(r for r in engine.metrics()["replicas"] if sid in r["sessions"])
                t_kill = time.monotonic()
                os.kill(replica["pid"], signal.SIGKILL)
                with pytest.raises(websockets.ConnectionClosed):
                    await _frames(ws, 100)
            moved = await _ws_url(http, sid, token)
            assert moved != url
            async with websockets.connect(f"{moved}?token={token}") as ws:
                after, texts = await _frames(ws, 8)
            gap = time.monotonic() - t_kill
            recovered = [t for t in texts if t.get("kind") == "recovered"]
            assert recovered and recovered[0]["from_replica"] == replica["id"], texts
            assert len(before) == len(after) == 8
            print(f"\nreplica killed: frames again after {gap:.2f} s over the new replica's "
                  "WebSocket")
            assert gap < 10
            await http.delete(f"/api/sessions/{sid}", headers=auth)

    asyncio.run(run())


# the page's WebSocket: from where, frames presented since `t`, its recoveries
PAGE = """(t) => { const S = window.worldstream; return {from: S.wsFrom, kind:
  document.getElementById('ws-badge').dataset.kind, shown: S.presented.filter((at) => at > t)
  .length, reconnects: S.wsReconnects, recovered: S.recovered, session: S.session}; }"""
PLAYING = """([t, from]) => { const S = window.worldstream; return S.transport === 'websocket'
  && S.wsFrom === from && S.presented.filter((at) => at > t).length >= 12; }"""


def _wait(page, predicate: str, arg) -> None:
    """Wait for ``predicate(arg)``; on a timeout fail with what the page shows."""
    from playwright.sync_api import TimeoutError as PageTimeout

    try:
        page.wait_for_function(predicate, arg=arg, timeout=20_000)
    except PageTimeout:
        state = page.evaluate(PAGE, 0)
        raise AssertionError(f"{state} log: {page.text_content('#ws-log')}") from None


@pytest.mark.browser
@pytest.mark.skipif(not CHROMIUM.exists(), reason=f"no Chromium at {CHROMIUM}")
def test_the_page_uses_the_replica_s_websocket_falls_back_and_recovers(media_cluster):
    """The page (app/static/ws_media.js), WebSocket chosen: its frames come from the replica's
    URL; that URL refused (a client that reaches only the front end), from the front end's
    route; its replica SIGKILLed, it reconnects to the new replica's URL and sees
    ``recovered``."""
    from playwright.sync_api import sync_playwright

    engine, server = media_cluster
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.goto(server.url, wait_until="domcontentloaded")
            page.wait_for_function(  # WebRTC first, as the page starts (auto)
                "document.getElementById('ws-badge')?.dataset.kind === 'webrtc'", timeout=60_000)
            t0 = page.evaluate("performance.now()")
            page.select_option("#ws-transport", "websocket")  # restarts on WebSocket
            _wait(page, PLAYING, [t0, "replica"])
            state = page.evaluate(PAGE, t0)
            assert state["from"] == "replica" and state["kind"] == "websocket", state
            sid = state["session"]["session_id"]
            rep = next(r for r in engine.metrics()["replicas"] if sid in r["sessions"])
            t_kill = page.evaluate("performance.now()")
            os.kill(rep["pid"], signal.SIGKILL)
            _wait(page, "(t) => window.worldstream.wsReconnects.some((r) => r.ok)"
                  " && window.worldstream.recovered.length >= 1"
                  " && window.worldstream.presented.filter((at) => at > t).length >= 12",
                  t_kill)
            state = page.evaluate(PAGE, t_kill)
            assert state["from"] == "replica" and state["reconnects"][0]["to"] == "replica"
            assert [r["from_replica"] for r in state["recovered"]] == [rep["id"]]
            print(f"\npage: WebSocket back on the new replica in "
                  f"{state['reconnects'][0]['ms'] / 1e3:.2f} s")
            # a replica the client cannot reach: the front end's route
            page.route("**/ws-url", lambda route: route.fulfill(
                json={"ws_url": "ws://127.0.0.1:9/api/sessions/x/ws"}))
            t1 = page.evaluate("performance.now()")
            page.click("#ws-restart")
            _wait(page, PLAYING, [t1, "front"])
        finally:
            browser.close()
