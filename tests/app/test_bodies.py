"""Bodies bounded before they are read (issue 74, kind 3): a chunked or lying body past its
route's limit is refused as it streams in, without the server reading the rest; uploads are
bounded per session and in all."""

from __future__ import annotations

import asyncio
import json

import pytest
from fastapi.testclient import TestClient

from tests.fixtures.server import create
from worldstream.app.bodies import UploadBudget
from worldstream.app.errors import ApiError
from worldstream.app.server import create_app
from worldstream.streaming.limits import Limits

CHUNK = 2**16


def _asgi_post(app, path: str, chunks: int, headers: list[tuple[bytes, bytes]]
               ) -> tuple[int, dict, int]:
    """POST ``chunks`` chunks of ``CHUNK`` bytes to ``path`` straight through ASGI (as a
    server streams a chunked body); ``(status, json body, chunks the app read)``."""
    read = 0
    sent: list[dict] = []

    async def receive() -> dict:
        nonlocal read
        if read < chunks:
            read += 1
            return {"type": "http.request", "body": b"{" + bytes(CHUNK - 1),
                    "more_body": read < chunks}
        await asyncio.sleep(3600)  # the client never disconnects on its own
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": path, "raw_path": path.encode(),
             "query_string": b"", "root_path": "", "client": ("127.0.0.1", 5000),
             "server": ("127.0.0.1", 80),
             "headers": [(b"host", b"127.0.0.1"), *headers]}

    async def run() -> None:
        await asyncio.wait_for(app(scope, receive, send), 30)

    asyncio.run(run())
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], json.loads(body), read


@pytest.fixture
def app(fake_engine, tmp_path):
    return create_app(fake_engine, Limits(max_sessions=2), ui=False, recording_dir=tmp_path)


def test_a_chunked_session_request_is_refused_as_it_streams(app):
    """32 MiB chunked to ``POST /api/sessions`` (the report sent 1 GiB): the app read the
    whole body before its 64 KB check (+2 GB of memory). Refused at the first chunk past
    the limit."""
    status, body, read = _asgi_post(app, "/api/sessions", 2**9,
                                    [(b"content-type", b"application/json"),
                                     (b"transfer-encoding", b"chunked")])
    assert status == 413 and body["field"] == "body", body
    assert read <= 2, f"read {read} chunks of a body refused at 64 KB"


def test_a_declared_oversize_body_is_refused_unread(app):
    status, body, read = _asgi_post(app, "/api/sessions", 2**14,
                                    [(b"content-type", b"application/json"),
                                     (b"content-length", str(2**30).encode())])
    assert status == 413 and read == 0, (body, read)
    status, body, read = _asgi_post(app, "/api/sessions", 4,
                                    [(b"content-type", b"application/json"),
                                     (b"content-length", b"12abc")])
    assert status == 400 and read == 0 and body["field"] == "content-length"


def test_an_offer_body_longer_than_declared_is_refused(app, fake_engine):
    with TestClient(app) as client:
        s = create(client)
        # declares 10 bytes, streams 1 MiB: counted as it arrives, not trusted
        status, body, read = _asgi_post(
            app, f"/api/sessions/{s['session_id']}/offer", 16,
            [(b"content-type", b"application/json"),
             (b"authorization", f"Bearer {s['token']}".encode()), (b"content-length", b"10")])
    assert status == 413 and read <= 2, (body, read)


def test_save_point_uploads_are_bounded_per_session_and_in_all():
    budget = UploadBudget(per_session=1, budget_bytes=3 * CHUNK)

    async def run() -> None:
        async with budget.slot("a") as first:
            first.take(2 * CHUNK)
            with pytest.raises(ApiError) as second:  # one per session in flight
                async with budget.slot("a"):
                    pass
            assert second.value.status == 429
            async with budget.slot("b") as other:
                other.take(CHUNK)
                with pytest.raises(ApiError) as full:  # the budget is taken: retry later
                    other.take(1)
                assert full.value.status == 503 and full.value.headers["Retry-After"]
            assert budget.bytes_in_flight == 2 * CHUNK
        assert budget.bytes_in_flight == 0
        async with budget.slot("c") as alone:
            with pytest.raises(ApiError) as large:  # larger than the whole budget
                alone.take(3 * CHUNK + 1)
            assert large.value.status == 413

    asyncio.run(run())
