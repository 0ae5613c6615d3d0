"""Who a replica's WebSocket admits (issue 55), without Ray: a media replica in this process
(no cluster address: loopback). The URL opens only for the token the front end handed over
and only to browser pages of the origins it named; each host counts a session's WebSockets
against the front end's limit; failed tries are throttled per address; a refusal changes
nothing."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time

import pytest
import websockets

from worldstream.engine.core.config import EngineConfig
from worldstream.streaming.limits import Limits
from worldstream.streaming.replica_media import MediaReplica

FRONT = "http://front.example:7860"


@pytest.fixture
def replica():
    rep = MediaReplica("emulated", EngineConfig(max_sessions=2, fps=16, mode="responsive"),
                       limits=Limits(auth_failure_burst=3, auth_failures_per_s=0.01))
    yield rep
    rep.stop()


async def _status(url: str, **kwargs) -> int:
    try:
        async with websockets.connect(url, **kwargs):
            return 101
    except websockets.InvalidStatus as refused:
        return refused.response.status_code


def test_token_origin_and_connection_limit(replica):
    info = replica.create_session("a meadow", 1, 16)
    assert "error" in replica.media_websocket(info.session_id, "pub", "", (FRONT,))  # no token
    url = replica.media_websocket(info.session_id, "pub", "secret", (FRONT, "https://b.example"
                                                                     ))["url"]
    assert url.startswith("ws://127.0.0.1:") and url.endswith("/api/sessions/pub/ws")

    async def run() -> None:
        ok = f"{url}?token=secret"
        assert await _status(ok, origin=FRONT) == 101
        assert await _status(ok, origin="https://b.example/") == 101  # an allowed origin
        assert await _status(ok, origin="http://127.0.0.1:9") == 403  # the replica's "own"
        assert await _status(ok) == 101  # no Origin: not a browser, the token guards
        async with contextlib.AsyncExitStack() as stack:
            for _ in range(2):
                await stack.enter_async_context(websockets.connect(ok))
            assert await _status(ok) == 429  # a third on this host
        assert await _status(ok) == 101  # both closed: room again
        other = url.replace("/pub/", "/nope/")
        assert await _status(f"{other}?token=secret") == 401  # unknown: no existence oracle
        # a burst of 3 failures (the unknown session was one), then 429
        assert [await _status(f"{url}?token=bad") for _ in range(4)] == [401] * 2 + [429] * 2
        assert await _status(ok) == 101  # an authenticated client is never refused for it

    asyncio.run(run())


def test_frames_leaving_here_number_on_from_the_front_end_s_offset(replica):
    """A session moved here by a failover: its frames leave numbered from the offset the front
    end gave (indices carry on), and each pull tells the front end how far they got (its
    next failover's offset). A negative offset is refused, as data."""
    info = replica.create_session("a meadow", 1, 16)
    assert "index_offset" in replica.media_websocket(info.session_id, "pub", "secret", (),
                                                     index_offset=-1)["message"]
    url = replica.media_websocket(info.session_id, "pub", "secret", (),
                                  index_offset=1000)["url"]

    async def first_indices() -> list[int]:
        indices = []
        async with websockets.connect(f"{url}?token=secret") as ws:
            await ws.send('{"type":"next"}')
            while len(indices) < 2:
                message = await asyncio.wait_for(ws.recv(), 10)
                if isinstance(message, bytes):
                    size = int.from_bytes(message[:4], "big")
                    indices.append(json.loads(message[4:4 + size])["index"])
                    await ws.send('{"type":"next"}')
        return indices

    indices = asyncio.run(first_indices())
    assert 1000 <= indices[0] < indices[1]
    reported = {}
    for _ in range(20):
        reported.update(replica.pull(0.2)["indices"])
        if reported.get(info.session_id, 0) > indices[1]:
            break
    assert reported[info.session_id] > indices[1]


def test_a_closed_session_s_socket_here_closes_without_credit(replica):
    """Issue 64, item 5: the front end's DELETE reaches the replica as ``close_session``; a
    client holding no ``next`` credit on the replica's WebSocket still gets the protocol's
    close within 2 s, after the ``closed`` event."""
    from worldstream.streaming.websocket import SESSION_ENDED_CODE, SESSION_ENDED_REASON

    info = replica.create_session("a meadow", 1, 16)
    url = replica.media_websocket(info.session_id, "pub", "secret", ())["url"]

    async def run() -> tuple[float, list[dict], tuple]:
        texts = []
        async with websockets.connect(f"{url}?token=secret") as ws:
            await asyncio.sleep(1.2)  # served: a stats message or two, no frame asked for
            start = time.monotonic()
            await asyncio.to_thread(replica.close_session, info.session_id)
            with contextlib.suppress(websockets.ConnectionClosed):
                while True:
                    message = await asyncio.wait_for(ws.recv(), 2.0)
                    texts.append(json.loads(message))
            return time.monotonic() - start, texts, (ws.close_code, ws.close_reason)

    seconds, texts, close = asyncio.run(run())
    assert seconds < 2.0 and close == (SESSION_ENDED_CODE, SESSION_ENDED_REASON)
    assert {"type": "event", "kind": "closed"} in texts
    assert not replica._media.sessions.sessions()  # nothing of it left here
