"""Fuzzing the server's inputs (issue 12): every client message type (as the WebSocket and the
data channel deliver them), every HTTP route, WebRTC offers mutated line by line. Each input is
answered by a 2xx/4xx or a protocol ``error``; nothing answers 500, nothing raises out of a
handler, and the session, its connection and the server keep serving afterwards.

Case counts (``max_examples``): control messages 400 (fake engine) + 200 (the real engine over
the simulator) + WebSocket 150 + HTTP 350 + SDP 150 = 1,250 per run. A game world's inputs (key
lists, key maps, env ids, dataset shards, save points, input logs) are ``test_fuzz_game``'s,
with these strategies and settings.
"""

from __future__ import annotations

import asyncio
import json
import string

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fixtures.server import auth, create
from worldstream.app.server import create_app
from worldstream.bench.adversarial import dead_offer
from worldstream.streaming.control import ControlChannel
from worldstream.streaming.limits import Limits
from worldstream.streaming.sessions import SessionManager
from worldstream.streaming.webrtc import TooManyPeerConnectionsError, WebRTCTransport

FUZZ = settings(deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
TYPES = ["action", "prompt", "settings", "fork", "adopt", "rewind", "ping", "next", "record",
         "dance", "", None, 1]

# JSON values of every kind, including the extremes the issue found (huge ints, NaN/Infinity,
# deep nesting, long strings)
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**340),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=60),
    st.sampled_from(["up", "down", "left", "right", "responsive", "quality", "a" * 401]),
)
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=12)
fields = st.sampled_from(["seq", "t", "keys", "pointer", "text", "blend", "steps",
                          "chunk_frames", "fps", "memory_frames", "attention", "mode", "k",
                          "branch", "chunks", "on", "weight", "extra"])


@st.composite
def client_messages(draw) -> str:
    """A text message: a typed object with random fields, or raw oddities."""
    kind = draw(st.integers(0, 9))
    if kind == 0:  # raw text: truncated JSON, nesting bombs, binary-ish strings
        return draw(st.one_of(
            st.text(max_size=200),
            st.integers(1, 3000).map(lambda n: "[" * n + "]" * n),
            st.integers(1, 3000).map(lambda n: '{"a":' * n + "1" + "}" * n),
            st.just('{"type":"ping","seq":1,"t":1' + " " * 5000 + "}"),
        ))
    message = {"type": draw(st.sampled_from(TYPES))}
    message.update(draw(st.dictionaries(fields, values, max_size=6)))
    text = json.dumps(message, allow_nan=True)
    if kind == 1:  # cut anywhere
        text = text[: draw(st.integers(0, len(text)))]
    return text


class _Recorder:
    def __init__(self):
        self.sent: list[dict] = []

    async def __call__(self, message: dict) -> None:
        json.dumps(message, allow_nan=False)  # every reply must be valid JSON for a browser
        self.sent.append(message)


@pytest.fixture(scope="module")
def channel_env(tmp_path_factory):
    from tests.conftest import FakeEngine

    engine = FakeEngine(capacity=64).start()
    limits = Limits(max_sessions=64, messages_per_s=1e9, message_burst=10**9)
    manager = SessionManager(engine, limits, tmp_path_factory.mktemp("rec"))
    yield engine, manager
    manager.close_all()
    engine.stop()


@pytest.mark.slow
@given(st.lists(client_messages(), min_size=1, max_size=5))
@settings(FUZZ, max_examples=400)
def test_control_messages_get_a_protocol_answer(channel_env, raws):
    """The data channel and the WebSocket hand every text message to ``ControlChannel``."""
    engine, manager = channel_env
    session = manager.sessions()[0] if len(manager) else manager.create("a meadow")
    out = _Recorder()
    control = ControlChannel(manager, session, out)

    async def feed():
        for raw in raws:
            await control.handle_text(raw)

    asyncio.run(feed())  # raises if any handler raised
    for reply in out.sent:
        assert reply["type"] in ("error", "pong", "event"), reply
        if reply["type"] == "error":
            assert reply["code"] and reply["message"]
    manager.stop_recording(session)
    # the session goes on: a ping is still answered
    out.sent.clear()
    asyncio.run(control.handle_text('{"type":"ping","seq":1,"t":1}'))
    assert out.sent and out.sent[-1]["type"] == "pong"


@pytest.fixture(scope="module")
def app_client(tmp_path_factory):
    from tests.conftest import FakeEngine

    engine = FakeEngine(capacity=64).start()
    limits = Limits(max_sessions=64, messages_per_s=1e9, message_burst=10**9,
                    auth_failure_burst=10**9, creation_burst=10**9)
    app = create_app(engine, limits, ui=False, recording_dir=tmp_path_factory.mktemp("rec"))
    with TestClient(app, raise_server_exceptions=True) as client:
        yield client, create(client)
    engine.stop()


@given(st.lists(client_messages(), min_size=1, max_size=4))
@settings(FUZZ, max_examples=150)
def test_websocket_survives_any_message(app_client, raws):
    client, session = app_client
    url = f"/api/sessions/{session['session_id']}/ws?token={session['token']}"
    with client.websocket_connect(url) as ws:
        for raw in raws:
            ws.send_text(raw)
        ws.send_text('{"type":"ping","seq":424242,"t":1}')
        while True:  # every reply is protocol JSON, and the connection still answers
            message = ws.receive()
            assert message["type"] == "websocket.send", message  # not closed
            if message.get("bytes") is not None:
                # a frame a {"type":"next"} credit asked for, when the engine had one ready
                # (timing-dependent): 4-byte big-endian header length, the JSON frame header
                data = message["bytes"]
                size = int.from_bytes(data[:4], "big")
                assert json.loads(data[4:4 + size])["type"] == "frame"
                continue
            reply = json.loads(message["text"])
            assert reply["type"] in ("error", "pong", "event", "stats"), reply
            if reply["type"] == "pong" and reply["seq"] == 424242:
                break


ROUTES = ["/api/health", "/api/sessions", "/api/metrics", "/api/sessions/{sid}",
          "/api/sessions/{sid}/offer", "/api/sessions/{sid}/recording.mp4",
          "/api/sessions/{sid}/frames.json", "/api/sessions/{unknown}/offer",
          "/api/sessions/%00%ff/offer", "/api/sessions/" + "x" * 3000]
bodies = st.one_of(
    st.binary(max_size=300),
    values.map(lambda v: json.dumps(v, allow_nan=True).encode()),
    st.dictionaries(st.sampled_from(["prompt", "seed", "fps", "sdp", "type", "x"]), values,
                    max_size=4).map(lambda d: json.dumps(d, allow_nan=True).encode()),
    st.integers(1, 3000).map(lambda n: ("[" * n + "]" * n).encode()),
    st.just(b'{"prompt":"' + b"a" * 70000 + b'"}'),
)
headers = st.fixed_dictionaries({}, optional={
    "Content-Type": st.sampled_from(["application/json", "text/plain",
                                     "application/json; charset=utf-8", "", "\u00e9"]),
    "Authorization": st.sampled_from(["Bearer ", "Bearer x", "Basic abc", "Bearer {token}",
                                      "bearer {token}"]),
    "Origin": st.sampled_from(["null", "http://testserver", "https://evil.example", "::"]),
})


@given(st.sampled_from(["GET", "POST", "DELETE", "PUT", "PATCH", "OPTIONS"]),
       st.sampled_from(ROUTES), bodies, headers,
       st.text(string.ascii_letters + string.digits + "%&=", max_size=30))
@settings(FUZZ, max_examples=350)
def test_http_routes_never_answer_500(app_client, method, route, body, head, query):
    client, session = app_client
    live = create(client) if method == "DELETE" else session  # do not delete the shared one
    path = route.format(sid=live["session_id"], unknown="0" * 32)
    head = {k: v.format(token=live["token"]).encode("latin-1") for k, v in head.items()}
    r = client.request(method, f"{path}?{query}", content=body, headers=head)
    assert r.status_code < 500, (r.status_code, r.text[:200])
    if r.status_code >= 400 and r.headers.get("content-type") == "application/json":
        assert "error" in r.json() or "detail" in r.json()
    if method == "DELETE" and r.status_code != 204:
        client.delete(f"/api/sessions/{live['session_id']}", headers=auth(live))
    assert client.get("/api/health").status_code == 200


OFFER = asyncio.run(dead_offer())
OFFER_LINES = OFFER.splitlines()


@st.composite
def mutated_offers(draw) -> str:
    lines = list(OFFER_LINES)
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.integers(0, 4))
        i = draw(st.integers(0, len(lines) - 1)) if lines else 0
        if op == 0 and lines:
            del lines[i]
        elif op == 1 and lines:
            line = lines[i]
            cut = draw(st.integers(0, len(line)))
            lines[i] = line[:cut] + draw(st.text(max_size=12)) + line[cut + 1:]
        elif op == 2:
            lines.insert(i, draw(st.sampled_from(["m=audio 9 UDP/TLS/RTP/SAVPF 0", "a=setup:bogus",
                                                  "a=ice-ufrag:", "a=fingerprint:sha-256 zz",
                                                  "m=video", "c=IN IP4", "a=mid:", "a=group:"])))
        elif op == 3 and lines:
            lines = lines[: i]  # truncated
        else:
            lines = [ln.replace(draw(st.sampled_from(["video", "UDP", "sha-256", "sendrecv",
                                                      "recvonly", "IN IP4", "webrtc-datachannel"])),
                                draw(st.sampled_from(["", "x", "audio", "0"]))) for ln in lines]
    return "\r\n".join(lines) + "\r\n"


@given(mutated_offers())
@settings(FUZZ, max_examples=150)
def test_mutated_offers_are_answered_or_refused(channel_env, sdp):
    """Straight into the transport's answer path (what the offer route calls): a mutation is
    negotiated or refused with ValueError (the route's 400), never another exception."""
    _, manager = channel_env
    session = manager.sessions()[0] if len(manager) else manager.create("a meadow")
    webrtc = WebRTCTransport(manager)

    async def offer():
        try:
            await webrtc.answer(session, sdp)
        except (ValueError, TooManyPeerConnectionsError):
            pass
        finally:
            await webrtc.close_all()
        return webrtc.peer_connections(session)

    assert asyncio.run(offer()) == 0  # nothing left open


@pytest.fixture(scope="module")
def real_session(sim_engine, tmp_path_factory):
    limits = Limits(max_sessions=4, messages_per_s=1e9, message_burst=10**9)
    manager = SessionManager(sim_engine, limits, tmp_path_factory.mktemp("rec"))
    session = manager.create("a green meadow with ponds", seed=1)
    manager.attach(session)  # generating, as with a viewer
    yield sim_engine, manager, session
    manager.close_all()


@pytest.mark.slow
@given(st.lists(client_messages(), min_size=1, max_size=5))
@settings(FUZZ, max_examples=200)
def test_real_engine_survives_any_message(real_session, raws):
    """The same messages into the real engine (sim backend): whatever passes the schema and is
    refused by the engine comes back as an ``error`` event; the session never fails."""
    engine, manager, session = real_session
    control = ControlChannel(manager, session, _Recorder())

    async def feed():
        for raw in raws:
            await control.handle_text(raw)

    asyncio.run(feed())
    manager.stop_recording(session)
    events = engine.events(session.session_id)  # SessionClosedError if the session failed
    while not events.empty():
        event = events.get_nowait()
        assert event.payload.get("code") != "session_failed", event.payload
    assert session.session_id in engine.metrics()["sessions"]
