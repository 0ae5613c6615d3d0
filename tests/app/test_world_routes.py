"""The HTTP routes of issue 15 over the real engine and the simulator: input log export, save
point download and load into another session, a start from a picture (refused by the
simulator), a storyboard; every bad body gets one 4xx with one line and changes nothing."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from worldstream.app.server import create_app
from worldstream.engine.studio.savepoint import read_meta
from worldstream.streaming.limits import Limits


@pytest.fixture
def client(sim_engine, tmp_path):
    app = create_app(sim_engine, Limits(max_sessions=4), ui=False, recording_dir=tmp_path)
    with TestClient(app) as c:
        yield c


def create(client, prompt="a green meadow with ponds", seed=4):
    r = client.post("/api/sessions", json={"prompt": prompt, "seed": seed})
    assert r.status_code == 201, r.text
    s = r.json()
    return s["session_id"], {"Authorization": f"Bearer {s['token']}"}, s["token"]


def test_save_load_log_and_story_round_trip(client):
    a, auth_a, token_a = create(client)
    b, auth_b, _ = create(client, "a dark landscape at night", 9)
    saved = client.get(f"/api/sessions/{a}/state?token={token_a}")
    assert saved.status_code == 200, saved.text
    assert saved.headers["content-type"] == "application/octet-stream"
    assert read_meta(saved.content)["session"]["prompt"] == "a green meadow with ponds"
    r = client.post(f"/api/sessions/{b}/state", content=saved.content,
                    headers={**auth_b, "Content-Type": "application/octet-stream"})
    assert r.status_code == 200, r.text
    assert r.json()["prompt"] == "a green meadow with ponds" and r.json()["seed"] == 4
    # B now holds A's world: its save file carries the same world
    again = client.get(f"/api/sessions/{b}/state", headers=auth_b)
    assert read_meta(again.content)["state"] == read_meta(saved.content)["state"]
    log = client.get(f"/api/sessions/{b}/log", headers=auth_b).json()
    assert log["format"] == "worldstream-input-log/1" and log["start"]["kind"] == "savepoint"
    story = {"seed": 2, "beats": [{"prompt": "a snowy forest", "duration_s": 2},
                                  {"prompt": "hot desert dunes", "duration_s": 1,
                                   "transition_s": 0.5}]}
    r = client.post(f"/api/sessions/{a}/story", json=story, headers=auth_a)
    assert r.status_code == 200, r.text
    assert r.json()["beats"] == 2 and r.json()["duration_s"] == 3.0
    assert client.get(f"/api/sessions/{a}/log", headers=auth_a).json()["seed"] == 2


def test_bad_bodies_get_one_error_each_and_change_nothing(client):
    a, auth, _ = create(client)
    before = client.get(f"/api/sessions/{a}/state", headers=auth).content
    octet = {**auth, "Content-Type": "application/octet-stream"}
    cases = [
        ("state", b"not a save file at all", octet, 400, "not a worldstream save point"),
        ("state", before[: len(before) // 2], octet, 400, "cut short"),
        ("state", before, {**auth, "Content-Type": "application/json"}, 415, "octet-stream"),
        ("state", before, {"Content-Type": "application/octet-stream"}, 401, "token"),
        ("picture", b"\x89PNG\r\n\x1a\n" + bytes(64), {**auth, "Content-Type": "image/png"},
         400, "model 'sim' cannot start from a picture"),
        ("picture", b"GIF89a", {**auth, "Content-Type": "image/gif"}, 415, "image/png"),
        ("picture", bytes(9 * 2**20), {**auth, "Content-Type": "image/png"}, 413, "limit"),
        ("story", b'{"beats": [{"prompt": "a", "duration_s": -1}]}',
         {**auth, "Content-Type": "application/json"}, 400, "beat 1, duration_s"),
        ("story", b'{"beats": [', {**auth, "Content-Type": "application/json"}, 400,
         "not valid JSON"),
    ]
    for route, body, headers, status, message in cases:
        r = client.post(f"/api/sessions/{a}/{route}", content=body, headers=headers)
        assert r.status_code == status, (route, r.text)
        assert message in r.json()["error"] and "\n" not in r.json()["error"]
    after = client.get(f"/api/sessions/{a}/state", headers=auth).content
    assert read_meta(after) == read_meta(before)
    assert client.get("/api/sessions/nope/log", headers=auth).status_code == 404
    assert json.loads(client.get(f"/api/sessions/{a}/log", headers=auth).content)["events"] == []
