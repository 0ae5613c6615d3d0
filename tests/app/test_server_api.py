"""HTTP routes and the WebSocket control path over a fake engine: status codes and error
bodies of the protocol, tokens, limits (503, 413, 429, idle timeout), recording download."""

from __future__ import annotations

import json
import time

import av
import pytest
from fastapi.testclient import TestClient

from tests.fixtures.server import auth, create, ws_url
from worldstream.app.server import create_app
from worldstream.streaming.limits import Limits
from worldstream.streaming.websocket import unpack_frame


@pytest.fixture
def client(fake_engine, tmp_path):
    app = create_app(fake_engine, Limits(max_sessions=2, messages_per_s=5, message_burst=5),
                     ui=False, recording_dir=tmp_path)
    with TestClient(app) as c:
        yield c


def test_health(client):
    assert client.get("/api/health").json() == {"status": "ok", "model": "fake",
                                                "world": "landscape", "sessions": 0,
                                                "capacity": 2}


def test_create_session_reply(client, fake_engine):
    s = create(client, seed=3, fps=12)
    # PROTOCOL.md's fields, plus the documented extension (PROTOCOL_EXTENSIONS.md: pixel art)
    assert set(s) == {"session_id", "token", "width", "height", "fps", "pixel_art"}
    assert s["pixel_art"] is False  # the fake engine's world is not a game
    assert (s["width"], s["height"], s["fps"]) == (64, 48, 12)
    assert len(s["token"]) >= 24
    assert client.get("/api/health").json()["sessions"] == 1


def test_full_server_answers_503_with_retry_after(client):
    create(client), create(client)
    r = client.post("/api/sessions", json={"prompt": "x"})
    assert r.status_code == 503
    assert r.json()["retry_after_s"] == 5.0 and r.headers["retry-after"] == "5"
    assert "error" in r.json()


def test_engine_capacity_error_is_503(fake_engine, tmp_path):
    fake_engine.capacity = 0
    with TestClient(create_app(fake_engine, ui=False, recording_dir=tmp_path)) as c:
        r = c.post("/api/sessions", json={"prompt": "x"})
    assert r.status_code == 503 and r.json()["retry_after_s"] == 7.0


@pytest.mark.parametrize("body, status, field", [
    (b"{", 400, "body"),
    (b'{"prompt": ""}', 400, "prompt"),
    (b'{"prompt": "a", "seed": -1}', 400, "seed"),
    (b'{"prompt": "' + b"a" * 70000 + b'"}', 413, "body"),
])
def test_bad_create_bodies(client, body, status, field):
    r = client.post("/api/sessions", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == status and r.json()["field"] == field


def test_token_is_required(client):
    s = create(client)
    assert client.delete(f"/api/sessions/{s['session_id']}").status_code == 401
    r = client.delete(f"/api/sessions/{s['session_id']}",
                      headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 401 and r.json()["field"] == "authorization"
    other = create(client)
    assert client.delete(f"/api/sessions/{s['session_id']}", headers=auth(other)
                         ).status_code == 401


def test_unknown_session_is_404(client):
    s = create(client)
    r = client.post("/api/sessions/nope/offer", json={"sdp": "v=0", "type": "offer"},
                    headers=auth(s))
    assert r.status_code == 404 and r.json()["field"] == "session_id"


def test_delete_closes_the_engine_session(client, fake_engine):
    s = create(client)
    assert client.delete(f"/api/sessions/{s['session_id']}", headers=auth(s)).status_code == 204
    assert fake_engine.num_sessions() == 0
    assert client.delete(f"/api/sessions/{s['session_id']}", headers=auth(s)).status_code == 404


def test_http_rate_limit_is_429(fake_engine, tmp_path):
    # a bucket that refills once in ~17 min: on a busy machine the eight requests may take
    # longer than the 0.2 s a 5/s bucket needs to give one back
    app = create_app(fake_engine, Limits(messages_per_s=0.001, message_burst=5), ui=False,
                     recording_dir=tmp_path)
    with TestClient(app) as client:
        s = create(client)
        codes = [client.get(f"/api/sessions/{s['session_id']}/recording.mp4", headers=auth(s)
                            ).status_code for _ in range(8)]
    assert codes[:5] == [404] * 5 and codes[5:] == [429] * 3


def test_offer_without_video_is_400(client):
    s = create(client)
    r = client.post(f"/api/sessions/{s['session_id']}/offer",
                    json={"sdp": "v=0\r\no=- 1 1 IN IP4 0.0.0.0\r\ns=-\r\nt=0 0\r\n",
                          "type": "offer"}, headers=auth(s))
    assert r.status_code == 400 and r.json()["field"] == "sdp"


def test_idle_sessions_are_reaped(fake_engine, tmp_path):
    now = [100.0]
    app = create_app(fake_engine, Limits(idle_timeout_s=30, detached_grace_s=1000), ui=False,
                     recording_dir=tmp_path)
    manager = app.state.manager
    manager._clock = lambda: now[0]
    with TestClient(app) as c:
        a, b = create(c), create(c)
        now[0] += 20
        c.get(f"/api/sessions/{b['session_id']}/recording.mp4", headers=auth(b))  # b active
        now[0] += 15
        assert manager.reap_idle() == [a["session_id"]]
        assert c.get("/api/health").json()["sessions"] == 1


def test_metrics_lists_sessions(client):
    s = create(client)
    body = client.get("/api/metrics", headers=auth(s)).json()
    assert body["model"] == "fake" and list(body["sessions"]) == [s["session_id"]]
    assert client.get("/api/metrics").json()["aggregate"]["sessions"] == 1


# ---------------------------------------------------------------- WebSocket control path


def test_ws_wrong_token_is_refused_with_401(client):
    s = create(client)
    with pytest.raises(Exception) as info:
        with client.websocket_connect(f"/api/sessions/{s['session_id']}/ws?token=bad"):
            pass
    assert getattr(info.value, "status_code", None) == 401


def test_ws_rejections_answer_error_and_session_goes_on(fake_engine, tmp_path):
    app = create_app(fake_engine, Limits(messages_per_s=0.001, message_burst=6), ui=False,
                     recording_dir=tmp_path)
    with TestClient(app) as c:
        s = create(c)
        with c.websocket_connect(ws_url(s)) as ws:
            sent = ['{"type":"ping","seq":1,"t":1' + " " * 5000 + "}",   # too large
                    '{"type":"fork","seq":2,"k":99}',                     # invalid field
                    '{"type":"dance","seq":3}',                           # unknown type
                    '{"type":"action","seq":4,"t":1,"keys":["right"]}']   # valid
            for raw in sent:
                ws.send_text(raw)
            ws.send_bytes(b"\x00\x01")                                    # binary
            replies = [json.loads(ws.receive_text()) for _ in range(4)]
            errors = [r for r in replies if r["type"] == "error"]
            assert [(e["code"], e["field"]) for e in errors] == [
                ("too_large", "message"), ("less_than_equal", "k"),
                ("unknown_type", "type"), ("malformed", "message")]
            assert fake_engine.submitted[-1][1].keys == frozenset({"right"})
            ws.send_text('{"type":"ping","seq":5,"t":1}')   # 6th message: the burst is spent
            ws.send_text('{"type":"ping","seq":6,"t":1}')
            reply = json.loads(ws.receive_text())
            while reply["type"] != "error":
                reply = json.loads(ws.receive_text())
            assert (reply["code"], reply["field"]) == ("rate_limited", "message")


def test_ws_pull_based_frames(client):
    s = create(client)
    with client.websocket_connect(ws_url(s)) as ws:
        ws.send_text('{"type":"action","seq":1,"t":42.0,"keys":["left"]}')
        headers = []
        for _ in range(6):
            ws.send_text('{"type":"next"}')
            msg = ws.receive()
            while msg.get("bytes") is None:
                msg = ws.receive()
            header, jpeg = unpack_frame(msg["bytes"])
            assert jpeg[:2] == b"\xff\xd8"
            headers.append(header)
        ticks = [h["rtp_ts"] for h in headers]
        assert ticks[0] == 0 and all(b > a for a, b in zip(ticks, ticks[1:], strict=False))
        assert all(t % 3000 == 0 for t in ticks)  # 90 kHz / 30 fps
        assert headers[-1]["action_seq"] == 1 and headers[-1]["action_t"] == 42.0


def test_ws_ping_and_recording(client):
    s = create(client)
    with client.websocket_connect(ws_url(s)) as ws:
        ws.send_text('{"type":"ping","seq":1,"t":7.5}')
        pong = json.loads(ws.receive_text())
        assert pong["type"] == "pong" and pong["seq"] == 1 and pong["t"] == 7.5
        ws.send_text('{"type":"record","seq":2,"on":true}')
        assert json.loads(ws.receive_text())["on"] is True
        time.sleep(1.0)
        ws.send_text('{"type":"record","seq":3,"on":false}')
        stopped = json.loads(ws.receive_text())
        while stopped.get("kind") != "recording":
            stopped = json.loads(ws.receive_text())
    r = client.get(stopped["url"], params={"token": s["token"]})
    assert r.status_code == 200 and r.headers["content-type"] == "video/mp4"
    path = client.app.state.manager.sessions()[0].recording_path
    with av.open(str(path)) as container:
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    assert 15 <= len(frames) <= 40  # ~1 s at 30 fps
    values = [int(f[10, 10, 0]) for f in frames]
    assert all(b >= a for a, b in zip(values, values[1:], strict=False))  # frame n = value n
