"""Every resource a client holds is bounded and released when the client goes (issue 12,
items 4 and 8): peer connections per session, offers that never connect, sessions whose client
vanished without a DELETE, the recordings of those clients, temporary recording folders."""

from __future__ import annotations

import asyncio
import os
import time

import av
import httpx
import pytest
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from fastapi.testclient import TestClient

from tests.conftest import LiveServer
from tests.fixtures.server import auth, create, ws_url
from worldstream.app.server import create_app
from worldstream.bench.adversarial import dead_offer
from worldstream.streaming.limits import Limits
from worldstream.streaming.sessions import REC_DIR_PREFIX, sweep_stale_recording_dirs
from worldstream.streaming.webrtc import bind_media


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


@pytest.fixture
def timed(fake_engine, tmp_path):
    """A server over the fake engine whose session manager runs on a hand-set clock."""
    clock = Clock()
    app = create_app(fake_engine, Limits(max_sessions=2, detached_grace_s=15,
                                         recording_keep_s=600), ui=False,
                     recording_dir=tmp_path)
    app.state.manager._clock = clock
    with TestClient(app) as client:
        yield client, app.state.manager, clock


def test_sessions_pause_without_a_viewer_and_resume_with_one(timed, fake_engine):
    client, manager, _ = timed
    s = create(client)
    sid = s["session_id"]
    assert fake_engine.paused_calls == [(sid, True)]  # nobody watches yet: no frames made
    with client.websocket_connect(ws_url(s)) as ws:
        ws.send_text('{"type":"ping","seq":1,"t":1}')
        ws.receive_text()
        assert fake_engine.paused_calls[-1] == (sid, False)
    assert fake_engine.paused_calls[-1] == (sid, True)


def test_vanished_clients_free_their_slot_within_the_grace_period(timed):
    """Full server: one session never connected, one whose client closed its socket without a
    DELETE (a crashed tab). Both go after the grace period, a new user is admitted."""
    client, manager, clock = timed
    never = create(client)
    crashed = create(client)
    with client.websocket_connect(ws_url(crashed)) as ws:
        ws.send_text('{"type":"ping","seq":1,"t":1}')
        ws.receive_text()
    assert client.post("/api/sessions", json={"prompt": "x"}).status_code == 503
    clock.t += 10
    assert manager.reap_idle() == []  # still within the grace: the tab may come back
    clock.t += 6
    assert sorted(manager.reap_idle()) == sorted([never["session_id"], crashed["session_id"]])
    create(client)  # admitted


def test_a_reattached_session_is_not_reaped(timed):
    client, manager, clock = timed
    s = create(client)
    clock.t += 14
    with client.websocket_connect(ws_url(s)) as ws:
        ws.send_text('{"type":"ping","seq":1,"t":1}')
        ws.receive_text()
        clock.t += 60  # watching: never reaped however long (the page pings)
        assert manager.reap_idle() == []


def test_recording_of_a_vanished_client_stays_downloadable(timed):
    client, manager, clock = timed
    s = create(client)
    with client.websocket_connect(ws_url(s)) as ws:
        ws.send_text('{"type":"record","seq":1,"on":true}')
        ws.receive_text()
        for _ in range(10):  # pull a few frames: the stream runs while it is watched
            ws.send_text('{"type":"next"}')
        time.sleep(1.0)
    # the client vanished: the recording stopped with its last transport
    path = manager.sessions()[0].recording_path
    assert manager.sessions()[0].recorder is None
    size = path.stat().st_size
    time.sleep(0.3)
    assert path.stat().st_size == size  # not growing with nobody watching
    clock.t += 16
    assert manager.reap_idle() == [s["session_id"]]
    url = f"/api/sessions/{s['session_id']}/recording.mp4"
    assert client.get(url, params={"token": "wrong"}).status_code == 401
    clock.t += 9 * 60  # nine minutes after the session ended
    manager.reap_idle()
    r = client.get(url, headers=auth(s))
    assert r.status_code == 200 and r.headers["content-type"] == "video/mp4"
    with av.open(str(path)) as container:
        values = [int(f.to_ndarray(format="rgb24")[5, 5, 0]) for f in container.decode(video=0)]
    assert len(values) >= 10 and all(b >= a for a, b in zip(values, values[1:], strict=False))
    clock.t += 2 * 60  # kept 10 minutes in all: then deleted
    manager.reap_idle()
    assert client.get(url, headers=auth(s)).status_code == 404 and not path.exists()


def test_stale_recording_folders_are_swept(tmp_path):
    dead = tmp_path / f"{REC_DIR_PREFIX}999999999-abc"  # no such process
    mine = tmp_path / f"{REC_DIR_PREFIX}{os.getpid()}-abc"
    other = tmp_path / "worldstream-something-else"
    for folder in (dead, mine, other):
        folder.mkdir()
        (folder / "x.mp4").write_bytes(b"x")
    assert sweep_stale_recording_dirs(tmp_path) == [dead]
    assert not dead.exists() and mine.exists() and other.exists()


def test_own_recording_folder_is_removed_on_stop(fake_engine):
    app = create_app(fake_engine, ui=False)
    folder = app.state.manager._recording_dir
    assert folder.name.startswith(f"{REC_DIR_PREFIX}{os.getpid()}-") and folder.is_dir()
    with TestClient(app):
        pass
    assert not folder.exists()


# ---------------------------------------------------------------- WebRTC offers
async def _flood_offers(url: str, webrtc) -> dict:
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        s = (await http.post("/api/sessions", json={"prompt": "a green meadow"})).json()
        post = f"/api/sessions/{s['session_id']}/offer"
        sdp = await dead_offer()
        replay = [(await http.post(post, json={"sdp": sdp, "type": "offer"}, headers=auth(s))
                   ).status_code for _ in range(2)]
        fresh = [(await http.post(post, json={"sdp": await dead_offer(), "type": "offer"},
                                  headers=auth(s))).status_code for _ in range(3)]
        session = webrtc.manager.sessions()[0]
        held = webrtc.peer_connections(session)
        await asyncio.sleep(1.5)  # past the connect timeout: the unconnected ones are closed
        after = webrtc.peer_connections(session)
        again = (await http.post(post, json={"sdp": await dead_offer(), "type": "offer"},
                                 headers=auth(s))).status_code
        health = (await http.get("/api/health")).status_code
    return {"replay": replay, "fresh": fresh, "held": held, "after": after, "again": again,
            "health": health}


@pytest.mark.slow
def test_offers_per_session_are_capped_and_unconnected_ones_time_out(sim_engine):
    """Issue 12, item 4: the same offer replayed and fresh offers whose peer never connects."""
    app = create_app(sim_engine, Limits(peer_connections_per_session=2,
                                        offer_connect_timeout_s=1.0), ui=False)
    with LiveServer(app) as server:
        got = asyncio.run(_flood_offers(server.url, app.state.webrtc))
    assert got["replay"] == [200, 400]  # the replayed offer: its ICE credentials are in use
    assert got["fresh"] == [200, 429, 429]  # two held at most
    assert got["held"] == 2 and got["after"] == 0
    assert got["again"] == 200 and got["health"] == 200


async def _connect_and_read(url: str) -> tuple[list[str], int]:
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        s = (await http.post("/api/sessions", json={"prompt": "a green meadow"})).json()
        pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        pc.addTransceiver("video", direction="recvonly")
        pc.createDataChannel("control")
        got_track: asyncio.Future = asyncio.get_running_loop().create_future()
        pc.on("track", got_track.set_result)
        await pc.setLocalDescription(await pc.createOffer())
        r = await http.post(f"/api/sessions/{s['session_id']}/offer", headers=auth(s),
                            json={"sdp": pc.localDescription.sdp, "type": "offer"})
        answer = r.json()
        candidates = [line for line in answer["sdp"].splitlines()
                      if line.startswith("a=candidate")]
        await pc.setRemoteDescription(RTCSessionDescription(**answer))
        track = await asyncio.wait_for(got_track, 20)
        frame = await asyncio.wait_for(track.recv(), 30)
        await pc.close()
    return candidates, frame.width


@pytest.mark.slow
def test_media_binds_to_the_http_address(sim_engine):
    """Issue 12, item 10: a loopback server's media sockets were on every interface."""
    try:
        bind_media("127.0.0.1")
        with LiveServer(create_app(sim_engine, ui=False)) as server:
            candidates, width = asyncio.run(_connect_and_read(server.url))
    finally:
        bind_media(None)
    assert candidates and all(" 127.0.0.1 " in c for c in candidates), candidates
    assert width == 128  # and the video still flows over it
