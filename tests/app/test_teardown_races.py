"""Teardown races (issue 57, item 1): operations on one session sent concurrently with its
DELETE, in seeded random interleavings, against the real engine over the simulator. Every
answer is a 2xx/4xx (never 500), nothing is logged with a traceback, and once the operations
are answered nothing is left of the session: no peer connection, closer, recorder, WebSocket,
task or engine session.

The requests go straight into the ASGI app (httpx's ASGI transport; the WebSocket through a
small ASGI driver below) on one event loop: each operation starts after a seeded random delay
of 0-20 ms, so the DELETE lands before, between or after the others' awaits.
``WORLDSTREAM_INTERLEAVINGS=1000`` runs the issue's 1,000.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import sys
import threading
import time
from collections import Counter

import httpx
import pytest

from worldstream.app.server import create_app
from worldstream.bench.adversarial import dead_offer
from worldstream.streaming.limits import Limits

OPS = ("offer", "offer", "ws", "ws", "picture", "load", "save", "log", "story", "recording",
       "frames", "metrics", "delete")
STORY = json.dumps({"seed": 1, "beats": [{"prompt": "a snowy forest", "duration_s": 1}]})
WS_TEXTS = ['{"type":"ping","seq":1,"t":1}', '{"type":"record","seq":2,"on":true}',
            '{"type":"next"}', '{"type":"fork","seq":3,"k":2}',
            '{"type":"action","seq":4,"t":1,"keys":["left"]}', '{"type":"next"}']


async def websocket(app, path: str, token: str, stay_s: float) -> int:
    """Open ``path`` as a WebSocket straight through the ASGI app, send ``WS_TEXTS``, leave
    after ``stay_s``; returns 101 when accepted, else the status of the denial."""
    inbox: asyncio.Queue = asyncio.Queue()
    inbox.put_nowait({"type": "websocket.connect"})
    status: list[int] = []
    loop = asyncio.get_running_loop()

    async def send(message: dict) -> None:
        if message["type"] == "websocket.accept":
            status.append(101)
            for text in WS_TEXTS:
                inbox.put_nowait({"type": "websocket.receive", "text": text})
            loop.call_later(stay_s, inbox.put_nowait,
                            {"type": "websocket.disconnect", "code": 1000})
        elif message["type"] == "websocket.http.response.start":
            status.append(message["status"])
        elif message["type"] == "websocket.close" and not status:
            status.append(403)  # closed before accepting

    scope = {"type": "websocket", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "scheme": "ws", "server": ("testserver", 80), "client": ("127.0.0.1", 50000),
             "root_path": "", "path": path, "raw_path": path.encode(),
             "query_string": f"token={token}".encode(), "headers": [(b"host", b"testserver")],
             "subprotocols": [], "extensions": {"websocket.http.response": {}}}
    await app(scope, inbox.get, send)
    return status[0] if status else 0


class Tracebacks(logging.Handler):
    """Every log record at ERROR or with exception info, and every exception the event loop's
    handler sees (a task's exception never retrieved, a failing callback)."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.ERROR or record.exc_info:
            self.records.append(f"{record.name}: {record.getMessage()}")

    def loop_handler(self, _loop, context: dict) -> None:
        self.records.append(f"event loop: {context.get('message')} {context.get('exception')!r}")


class Harness:
    def __init__(self, app, offers: list[str], saved: bytes):
        self.app, self.offers, self.saved = app, offers, saved
        self.manager, self.webrtc = app.state.manager, app.state.webrtc
        self.raised: list[str] = []
        self.http = httpx.AsyncClient(transport=httpx.ASGITransport(
            app=app, raise_app_exceptions=False), base_url="http://testserver", timeout=60)

    async def op(self, name: str, s: dict, delay: float, rng: random.Random) -> int:
        """Operation ``name`` on session ``s`` after ``delay``: its HTTP status (101: a
        WebSocket accepted; 599: an exception came out of the app)."""
        await asyncio.sleep(delay)
        try:
            return await self._op(name, s, rng)
        except Exception as err:  # out of the app: a 500 with a traceback in a real server
            self.raised.append(f"{name}: {err!r}")
            return 599

    async def _op(self, name: str, s: dict, rng: random.Random) -> int:
        sid, head = s["session_id"], {"Authorization": f"Bearer {s['token']}"}
        base = f"/api/sessions/{sid}"
        if name == "offer":
            r = await self.http.post(f"{base}/offer", headers=head,
                                     json={"sdp": rng.choice(self.offers), "type": "offer"})
        elif name == "ws":
            return await websocket(self.app, f"{base}/ws", s["token"], rng.uniform(0, 0.03))
        elif name in ("picture", "load", "story"):
            kind, body = {"picture": ("image/png", b"\x89PNG\r\n\x1a\n" + bytes(64)),
                          "load": ("application/octet-stream", self.saved),
                          "story": ("application/json", STORY.encode())}[name]
            route = {"load": "state"}.get(name, name)
            r = await self.http.post(f"{base}/{route}", content=body,
                                     headers={**head, "Content-Type": kind})
        elif name == "delete":
            r = await self.http.delete(base, headers=head)
        elif name == "metrics":
            r = await self.http.get("/api/metrics", headers=head)
        else:
            route = {"save": "state", "recording": "recording.mp4", "frames": "frames.json"}
            r = await self.http.get(f"{base}/{route.get(name, name)}", headers=head)
        return r.status_code

    def leftovers(self, session, tasks_before: int) -> list[str]:
        """What is still held for the closed ``session`` (empty: nothing)."""
        sid = session.session_id
        left = []
        if self.webrtc.peer_connections(session):
            left.append(f"{self.webrtc.peer_connections(session)} peer connections")
        if session.closers:
            left.append(f"{len(session.closers)} closers")
        if session.recorder is not None or any(
                t.name == f"recorder-{sid}.mp4" for t in threading.enumerate()):
            left.append("a recorder")
        if session.websockets or session.transports:
            left.append(f"{session.websockets} WebSockets, {session.transports} transports")
        if sid in self.manager.engine.metrics()["sessions"] or sid in {
                s.session_id for s in self.manager.sessions()}:
            left.append("the session itself")
        if len(asyncio.all_tasks()) > tasks_before:
            left.append(f"{len(asyncio.all_tasks()) - tasks_before} tasks")
        return left

    async def interleaving(self, seed: int) -> tuple[Counter, list[str]]:
        rng = random.Random(seed)
        tasks_before = len(asyncio.all_tasks())
        created = await self.http.post("/api/sessions", json={"prompt": "a green meadow"})
        assert created.status_code == 201, created.text
        s = created.json()
        (session,) = [x for x in self.manager.sessions() if x.session_id == s["session_id"]]
        ops = [rng.choice(OPS) for _ in range(rng.randint(2, 6))] + ["delete"]
        statuses = await asyncio.gather(*(self.op(name, s, rng.uniform(0, 0.02), rng)
                                          for name in ops))
        deadline = time.monotonic() + 10
        while (left := self.leftovers(session, tasks_before)) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        return Counter(f"{n} {c}" for n, c in zip(ops, statuses, strict=True)), left


async def run_interleavings(app, seeds: range) -> dict:
    tracebacks = Tracebacks()
    logging.getLogger().addHandler(tracebacks)
    asyncio.get_running_loop().set_exception_handler(tracebacks.loop_handler)
    answers: Counter = Counter()
    leaks: dict[int, list[str]] = {}
    try:
        async with app.router.lifespan_context(app):
            offers = [await dead_offer() for _ in range(4)]
            h = Harness(app, offers, b"")
            s = (await h.http.post("/api/sessions", json={"prompt": "a green meadow"})).json()
            head = {"Authorization": f"Bearer {s['token']}"}
            h.saved = (await h.http.get(f"/api/sessions/{s['session_id']}/state",
                                        headers=head)).content
            await h.http.delete(f"/api/sessions/{s['session_id']}", headers=head)
            for seed in seeds:
                got, left = await h.interleaving(seed)
                answers.update(got)
                if left:
                    leaks[seed] = left
            await h.http.aclose()
    finally:
        logging.getLogger().removeHandler(tracebacks)
    return {"answers": answers, "leaks": leaks, "tracebacks": h.raised + tracebacks.records}


@pytest.fixture
def race_app(sim_engine, tmp_path):
    limits = Limits(max_sessions=4, messages_per_s=1e9, message_burst=10**9,
                    auth_failure_burst=10**9, creation_burst=10**9,
                    peer_connections_per_session=2)
    return create_app(sim_engine, limits, ui=False, recording_dir=tmp_path,
                      reap_period_s=3600)


def test_teardown_races_answer_4xx_and_leave_nothing(race_app):
    count = int(os.environ.get("WORLDSTREAM_INTERLEAVINGS", "100"))
    t0 = time.monotonic()
    got = asyncio.run(run_interleavings(race_app, range(count)))
    print(f"{count} interleavings in {time.monotonic() - t0:.1f} s: {dict(got['answers'])}")
    errors = {k: v for k, v in got["answers"].items() if int(k.split()[1]) >= 500}
    assert not errors, errors
    assert not got["tracebacks"], got["tracebacks"][:5]
    assert not got["leaks"], dict(list(got["leaks"].items())[:5])
    # the race was exercised: some requests answered before the DELETE, some after it (which
    # kinds won depends on the machine's load: an offer is slow beside a busy core)
    ops = {k for k in got["answers"] if not k.startswith("delete")}
    assert any(k.endswith(" 200") for k in ops) and any(k.endswith(" 404") for k in ops)


def test_game_session_teardown_races_answer_4xx_and_leave_nothing(tmp_path, monkeypatch):
    """The same races on a game world (``play --env ALE/Breakout-v5``): its keys arrive on
    the WebSocket (held, changed, refused) while the session is deleted; a save point of the
    game is loaded, a picture (which a game refuses) and a story sent."""
    from worldstream.app.cmd_play import play_config
    from worldstream.engine.backends.game.sim import GameEnvBackend
    from worldstream.engine.core.engine import Engine

    monkeypatch.setattr(sys.modules[__name__], "WS_TEXTS", [
        '{"type":"action","seq":1,"t":1,"keys":["fire"]}', '{"type":"next"}',
        '{"type":"action","seq":2,"t":1,"keys":["left","fire"]}',
        '{"type":"action","seq":3,"t":1,"keys":["up"]}', '{"type":"rewind","seq":4,"chunks":1}',
        '{"type":"fork","seq":5,"k":2}', '{"type":"action","seq":6,"t":1,"keys":[]}',
        '{"type":"next"}'])
    limits = Limits(max_sessions=4, messages_per_s=1e9, message_burst=10**9,
                    auth_failure_burst=10**9, creation_burst=10**9,
                    peer_connections_per_session=2)
    with Engine(GameEnvBackend(env="ALE/Breakout-v5"), play_config(max_sessions=4)) as engine:
        app = create_app(engine, limits, ui=False, recording_dir=tmp_path, reap_period_s=3600)
        got = asyncio.run(run_interleavings(app, range(30)))
    print(dict(got["answers"]))
    errors = {k: v for k, v in got["answers"].items() if int(k.split()[1]) >= 500}
    assert not errors, errors
    assert not got["tracebacks"], got["tracebacks"][:5]
    assert not got["leaks"], dict(list(got["leaks"].items())[:5])
    assert got["answers"]["ws 101"] and got["answers"]["load 200"] + got["answers"]["load 404"]
