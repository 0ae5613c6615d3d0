"""Who a replica's WebSocket admits (issue 55), without Ray: a media replica in this process
(no cluster address: loopback). The URL opens only for the token the front end handed over
and only to browser pages of the origins it named; each host counts a session's WebSockets
against the front end's limit; failed tries are throttled per address; a refusal changes
nothing."""

from __future__ import annotations

import asyncio
import contextlib

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
