"""What an anonymous caller reaches (issue 57, item 4). While a session streams and records,
every route the server has (its API, the page's files, every route of the mounted UI
framework) is requested without a credential: no reply carries a session id, a token, a
filesystem path or a per-session figure; the UI framework's schema, config, upload and queue
routes are not served, the page is; ``/api/metrics`` is aggregate only, and a session's token
shows that session's figures (the failing input: ids, fps and recording state of every live
session, and 200 from ``/openapi.json``, ``/config`` and ``/gradio_api/info``)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from tests.fixtures.server import auth, create, ws_url
from worldstream.app.server import create_app

#: what an anonymous caller may read (README, "Serving other people")
PUBLIC = {"/", "/theme.css", "/favicon.ico", "/ws-static/play.js", "/api/health",
          "/api/metrics", "/api/controls"}
NOT_SERVED = ("/openapi.json", "/docs", "/redoc", "/config", "/gradio_api/info",
              "/gradio_api/openapi.json", "/monitoring", "/gradio_api/queue/status",
              "/gradio_api/upload", "/gradio_api/file=/etc/passwd")


def _paths(routes, prefix: str = "") -> set[str]:
    """Every path of ``routes`` and of the apps and routers mounted or included in them (a
    FastAPI app's schema lists its routes, those of included routers too)."""
    found = set()
    for route in routes:
        path = prefix + getattr(route, "path", "")
        mounted = getattr(route, "app", None)
        if isinstance(mounted, FastAPI):
            found |= {path.rstrip("/") + p for p in mounted.openapi()["paths"]}
        included = getattr(route, "original_router", route)  # FastAPI's included router
        if getattr(included, "routes", None):
            found |= _paths(included.routes, path.rstrip("/"))
        elif path:
            found.add(path)
    return found


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from tests.conftest import FakeEngine

    engine = FakeEngine().start()
    app = create_app(engine, ui=True, recording_dir=tmp_path_factory.mktemp("rec"))
    with TestClient(app) as client:
        yield app, client
    engine.stop()


def test_anonymous_callers_read_no_session_token_path_or_figure(served):
    app, client = served
    s = create(client)
    with client.websocket_connect(ws_url(s)) as ws:  # streaming and recording
        ws.send_text('{"type":"record","seq":1,"on":true}')
        for _ in range(3):
            ws.send_text('{"type":"next"}')
        while ws.receive().get("bytes") is None:
            pass
        recording = app.state.manager.sessions()[0].recording_path
        secrets = {"session id": s["session_id"], "token": s["token"],
                   "recording": str(recording.parent), "repository": str(Path(__file__).parents[2]),
                   "python": sys.prefix, "temporary folder": "/tmp/"}
        answers = {}
        for path in sorted(_paths(app.routes) | set(NOT_SERVED) | PUBLIC):
            url = re.sub(r"\{session_id\}", s["session_id"], path)
            url = re.sub(r"\{[^}]*\}", "x", url)
            r = client.get(url)
            answers[url] = r.status_code
            for name, secret in secrets.items():
                assert secret not in r.text, (url, r.status_code, name)
        metrics = client.get("/api/metrics").json()
        own = client.get("/api/metrics", headers=auth(s)).json()
    served_ok = {url for url, status in answers.items() if status < 400}
    assert served_ok == PUBLIC, served_ok ^ PUBLIC
    assert all(answers[path] == 404 for path in NOT_SERVED)
    assert client.post("/gradio_api/upload", files={"files": ("a.txt", b"x")}).status_code == 404
    # metrics: aggregates without a credential; the session's own figures with its token
    assert metrics["sessions"] == {} and metrics["engine"].get("sessions") in (1, {})
    assert metrics["aggregate"]["sessions"] == 1 and metrics["aggregate"]["frames_sent"] >= 1
    assert list(own["sessions"]) == [s["session_id"]]
    assert own["sessions"][s["session_id"]]["recording"] is True
    assert client.get("/api/metrics", headers={"Authorization": "Bearer nope"}
                      ).status_code == 401


def test_replicas_show_no_process_host_or_other_sessions_without_the_key():
    from worldstream.app.metrics import metrics_body

    engine = {"num_sessions": 2, "sessions": {"a": {"fps": 20.0}, "b": {"fps": 19.0}},
              "replicas": [{"id": 0, "pid": 4242, "node": "gpu-host-7", "alive": True,
                            "sessions": ["a", "b"], "chunk_ms_p50": 9.0, "chunk_ms_p95": 12.0,
                            "failovers": 0, "received": {"a": 3, "b": 5}}]}
    anonymous = metrics_body("m", 4, [], engine, set())
    assert anonymous["replicas"] == [{"id": 0, "alive": True, "chunk_ms_p50": 9.0,
                                      "chunk_ms_p95": 12.0, "failovers": 0, "num_sessions": 2,
                                      "sessions": []}]
    assert anonymous["engine"] == {"num_sessions": 2, "sessions": {}}
    own = metrics_body("m", 4, [], engine, {"a"})
    assert own["replicas"][0]["sessions"] == ["a"] and list(own["engine"]["sessions"]) == ["a"]
    assert metrics_body("m", 4, [], engine, None)["replicas"] == engine["replicas"]
