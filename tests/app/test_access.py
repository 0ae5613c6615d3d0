"""Who may use the server (issue 12, items 7, 9, 10): cross-site requests, DNS rebinding, the
server key of an exposed deployment, the failed-authentication throttle, the per-client limit."""

from __future__ import annotations

import asyncio
import secrets

import pytest
from fastapi.testclient import TestClient

from tests.fixtures.server import auth, create, ws_url
from worldstream.app.access import AccessPolicy, is_loopback
from worldstream.app.server import create_app
from worldstream.streaming.limits import Limits

KEY = "k" * 24


def make(fake_engine, tmp_path, access=None, **limits):
    app = create_app(fake_engine, Limits(max_sessions=4, **limits), ui=False,
                     recording_dir=tmp_path, access=access)
    return TestClient(app)


def test_cross_site_session_creation_is_refused(fake_engine, tmp_path):
    """The failing input: text/plain, a foreign Origin, a foreign Host, four times."""
    access = AccessPolicy.for_bind("127.0.0.1")
    with make(fake_engine, tmp_path, access) as c:
        local = {"Host": "127.0.0.1:7860"}
        plain = c.post("/api/sessions", content=b'{"prompt":"x"}',
                       headers={**local, "Content-Type": "text/plain"})
        assert plain.status_code == 415 and plain.json()["field"] == "content-type"
        evil = c.post("/api/sessions", json={"prompt": "x"},
                      headers={**local, "Origin": "https://evil.example"})
        assert evil.status_code == 403 and evil.json()["field"] == "origin"
        rebound = c.post("/api/sessions", json={"prompt": "x"},
                         headers={"Host": "evil.example"})
        assert rebound.status_code == 400
        assert fake_engine.num_sessions() == 0
        # the page itself: same origin, JSON
        ok = c.post("/api/sessions", json={"prompt": "x"},
                    headers={**local, "Origin": "http://127.0.0.1:7860"})
        assert ok.status_code == 201


def test_cross_site_websocket_is_refused(fake_engine, tmp_path):
    with make(fake_engine, tmp_path) as c:
        s = create(c)
        url = f"/api/sessions/{s['session_id']}/ws?token={s['token']}"
        with pytest.raises(Exception) as info:
            with c.websocket_connect(url, headers={"Origin": "https://evil.example"}):
                pass
        assert getattr(info.value, "status_code", None) == 403
        with c.websocket_connect(url, headers={"Origin": "http://testserver"}) as ws:
            ws.send_text('{"type":"ping","seq":1,"t":1}')
            assert '"pong"' in ws.receive_text()


def test_server_key_gates_sessions_and_metrics(fake_engine, tmp_path):
    with make(fake_engine, tmp_path, AccessPolicy(auth_key=KEY)) as c:
        assert c.post("/api/sessions", json={"prompt": "x"}).status_code == 401
        wrong = {"Authorization": "Bearer " + "x" * 24}
        assert c.post("/api/sessions", json={"prompt": "x"}, headers=wrong).status_code == 401
        key = {"Authorization": f"Bearer {KEY}"}
        s = c.post("/api/sessions", json={"prompt": "x"}, headers=key).json()
        assert c.get("/api/metrics").status_code == 401
        assert s["session_id"] in c.get("/api/metrics", headers=key).json()["sessions"]
        assert c.get("/api/health").status_code == 200  # for load balancers
        # no existence oracle: an unknown id answers exactly like a wrong token
        other = f"/api/sessions/{secrets.token_hex(16)}"
        mine = f"/api/sessions/{s['session_id']}"
        a = c.delete(other, headers={"Authorization": "Bearer nope"})
        b = c.delete(mine, headers={"Authorization": "Bearer nope"})
        assert (a.status_code, a.json()) == (b.status_code, b.json()) == (
            401, {"error": "missing or wrong bearer token", "field": "authorization"})
        assert c.delete(mine, headers=auth(s)).status_code == 204


def test_docs_are_not_served(fake_engine, tmp_path):
    with make(fake_engine, tmp_path) as c:
        for path in ("/docs", "/redoc", "/openapi.json"):
            assert c.get(path).status_code == 404


def test_failed_authentications_are_throttled(fake_engine, tmp_path):
    """The failing input: 300 random tokens answered 401 without a 429."""
    with make(fake_engine, tmp_path, auth_failure_burst=20, auth_failures_per_s=0.01) as c:
        s = create(c)
        url = f"/api/sessions/{s['session_id']}"
        codes = [c.delete(url, headers={"Authorization": f"Bearer {secrets.token_urlsafe(24)}"}
                          ).status_code for _ in range(300)]
        assert codes[:20] == [401] * 20 and set(codes[20:]) == {429}
        # only failing requests are refused: the session's own token still works (issue 57)
        assert c.delete(url, headers=auth(s)).status_code == 204
        assert fake_engine.num_sessions() == 0


@pytest.mark.parametrize("key", [None, KEY])
def test_a_flooding_session_does_not_lock_out_another_at_its_address(fake_engine, tmp_path,
                                                                     key):
    """Issue 57, item 3, the failing input: session A floods its offer route (valid offers
    that never connect, then offers to its closed session); session B, created afterwards from
    the same address (users behind one NAT), then got 429 on each of its offers."""
    from worldstream.bench.adversarial import dead_offer

    offers = [asyncio.run(dead_offer()) for _ in range(3)]
    access = AccessPolicy(auth_key=key) if key else None
    server_key = {"Authorization": f"Bearer {key}"} if key else {}
    with make(fake_engine, tmp_path, access, auth_failure_burst=5,
              auth_failures_per_s=0.01) as c:
        def new() -> dict:
            r = c.post("/api/sessions", json={"prompt": "x"}, headers=server_key)
            assert r.status_code == 201, r.text
            return r.json()

        a = new()
        post = f"/api/sessions/{a['session_id']}/offer"
        flood = [c.post(post, headers=auth(a), json={"sdp": sdp, "type": "offer"}).status_code
                 for sdp in offers]
        assert flood == [200, 200, 429]  # its peer connections: its own limit
        c.delete(f"/api/sessions/{a['session_id']}", headers=auth(a))
        closed = [c.post(post, headers=auth(a), json={"sdp": offers[0], "type": "offer"}
                         ).status_code for _ in range(30)]
        assert set(closed[5:]) == {429}  # this address is past its failures
        b = new()  # as if alone
        route = f"/api/sessions/{b['session_id']}"
        got = [c.post(f"{route}/offer", headers=auth(b), json={"sdp": sdp, "type": "offer"}
                      ).status_code for sdp in offers[:2]]
        got += [c.get(f"{route}/frames.json", headers=auth(b)).status_code,
                c.get("/api/metrics", headers=auth(b)).status_code]
        with c.websocket_connect(ws_url(b)) as ws:
            ws.send_text('{"type":"ping","seq":1,"t":1}')
            assert '"pong"' in ws.receive_text()
        got.append(c.delete(route, headers=auth(b)).status_code)
        assert got == [200, 200, 200, 200, 204]
        # a failing request from the address is still refused
        assert c.delete(route, headers={"Authorization": "Bearer nope"}).status_code == 429


def test_sessions_per_client(fake_engine, tmp_path):
    with make(fake_engine, tmp_path, sessions_per_client=1) as c:
        create(c)
        r = c.post("/api/sessions", json={"prompt": "x"})
        assert r.status_code == 503 and "this client" in r.json()["error"]


def test_policy_for_bind_addresses():
    assert AccessPolicy.for_bind("127.0.0.1").allowed_hosts[:2] == ("localhost", "127.0.0.1")
    assert AccessPolicy.for_bind("0.0.0.0").allowed_hosts is None
    assert AccessPolicy.for_bind("0.0.0.0", extra_hosts=("play.example",)).allowed_hosts == (
        "play.example",)
    assert AccessPolicy.for_bind("10.0.0.5").allowed_hosts == ("10.0.0.5",)
    assert is_loopback("::1") and is_loopback("localhost") and not is_loopback("10.0.0.5")
    policy = AccessPolicy(allowed_origins=("https://app.example",))
    assert policy.origin_ok(None, "h:1") and policy.origin_ok("http://h:1", "h:1")
    assert policy.origin_ok("https://app.example", "h:1")
    assert not policy.origin_ok("http://h:2", "h:1") and not policy.origin_ok("null", "h:1")
    with pytest.raises(ValueError):
        AccessPolicy(auth_key="short")


def test_session_creation_is_rate_limited_per_client(fake_engine, tmp_path):
    """A create/DELETE loop costs every stream the engine's prompt encoding and state."""
    with make(fake_engine, tmp_path, creation_burst=3, creations_per_s=0.01) as c:
        codes = []
        for _ in range(5):
            r = c.post("/api/sessions", json={"prompt": "x"})
            codes.append(r.status_code)
            if r.status_code == 201:
                c.delete(f"/api/sessions/{r.json()['session_id']}", headers=auth(r.json()))
        assert codes == [201, 201, 201, 429, 429]


def test_websockets_per_session_are_capped(fake_engine, tmp_path):
    with make(fake_engine, tmp_path, websockets_per_session=2) as c:
        s = create(c)
        url = f"/api/sessions/{s['session_id']}/ws?token={s['token']}"
        with c.websocket_connect(url) as a, c.websocket_connect(url) as b:
            for ws in (a, b):
                ws.send_text('{"type":"ping","seq":1,"t":1}')
                assert '"pong"' in ws.receive_text()
            with pytest.raises(Exception) as info:
                with c.websocket_connect(url):
                    pass
            assert getattr(info.value, "status_code", None) == 429
        with c.websocket_connect(url) as again:  # closed ones free their place
            again.send_text('{"type":"ping","seq":2,"t":1}')
            assert '"pong"' in again.receive_text()
