"""Matrix-Game 2.0 through the server on tiny random weights (CPU): each variant tells the page
its keys (WASD + look keys and the mouse for universal, W/S + A/D steering for GTA, the Temple
Run keys) and whether it takes the mouse; a session takes keys with mouse motion on the wire,
refuses another variant's key and a prompt (it has none), and starts from a picture."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from fastapi.testclient import TestClient
from PIL import Image

from tests.fixtures.matrix_game import tiny_parts
from tests.fixtures.server import auth, create, ws_url
from worldstream.app.server import create_app
from worldstream.engine.backends.matrix_game.backend import (
    MatrixGameBackend,
    MatrixGameBackendConfig,
)
from worldstream.engine.core.config import EngineConfig
from worldstream.engine.core.engine import Engine
from worldstream.engine.studio.savepoint import read_meta
from worldstream.streaming.websocket import unpack_frame


def tiny_backend(variant: str, **settings) -> MatrixGameBackend:
    model, cfg, vae, encoder = tiny_parts(variant)
    return MatrixGameBackend(model, cfg, vae, encoder, MatrixGameBackendConfig(
        variant=variant, height=32, width=48, device="cpu", cond_frames=2, **settings))


def engine_config() -> EngineConfig:
    return EngineConfig(max_sessions=2, fps=12, steps=1, buffer_max_frames=14)


@pytest.mark.parametrize("variant, codes, mouse", [
    ("universal", {"KeyW": "forward", "KeyD": "right", "ArrowLeft": "look_left"}, True),
    ("gta_drive", {"KeyW": "forward", "KeyA": "left", "ArrowDown": "back"}, False),
    ("templerun", {"KeyW": "jump", "KeyS": "slide", "KeyZ": "turn_left", "KeyC": "turn_right",
                   "KeyA": "left", "KeyD": "right"}, False),
])
def test_each_variant_tells_the_page_its_controls(variant, codes, mouse):
    backend = tiny_backend(variant)
    with Engine(backend, engine_config()) as engine:
        with TestClient(create_app(engine, ui=False)) as c:
            controls = c.get("/api/controls").json()
    assert controls["world"] == "game" and controls["mouse"] is mouse
    assert controls["variant"] == variant and controls["model"] == "matrix-game-2"
    assert codes.items() <= controls["keys"].items()
    assert set(controls["actions"]) == set(backend.variant.keys)
    assert engine.model_name == f"matrix-game-2:{variant}"


def _until(ws, want, limit=60):
    for _ in range(limit):
        data = ws.receive()
        if data.get("bytes") is not None:
            ws.send_text('{"type":"next"}')
            msg = unpack_frame(data["bytes"])[0]
        else:
            msg = json.loads(data["text"])
        if want(msg):
            return msg
    raise AssertionError("no such message")


def test_a_session_takes_keys_and_mouse_and_refuses_what_the_model_lacks(tmp_path):
    with Engine(tiny_backend("universal"), engine_config()) as engine:
        app = create_app(engine, ui=False, recording_dir=tmp_path)
        with TestClient(app) as c:
            s = create(c)
            assert (s["width"], s["height"]) == (48, 32)
            with c.websocket_connect(ws_url(s)) as ws:
                ws.send_text('{"type":"next"}')
                for seq, extra in ((1, {"keys": ["forward", "look_up"], "pointer": [12, -3]}),
                                   (2, {"keys": ["jump"]}), (3, {"keys": [],
                                                                 "pointer": [5000, 0]})):
                    ws.send_text(json.dumps({"type": "action", "seq": seq, "t": 0, **extra}))
                err = _until(ws, lambda m: m["type"] == "error")
                assert (err["seq"], err["field"]) == (2, "keys.0")  # a Temple Run key
                err = _until(ws, lambda m: m["type"] == "error")
                assert (err["seq"], err["field"]) == (3, "pointer.0")  # a huge delta
                ws.send_text('{"type":"prompt","seq":4,"t":0,"text":"a snowy forest"}')
                err = _until(ws, lambda m: m["type"] == "error")
                assert (err["seq"], err["field"]) == (4, "text")
                assert "no text prompt" in err["message"]
                frame = _until(ws, lambda m: m["type"] == "frame" and m["action_seq"] == 1)
                assert frame["index"] >= 0
            log = c.get(f"/api/sessions/{s['session_id']}/log",
                        headers={"Authorization": f"Bearer {s['token']}"}).json()
            actions = [e for e in log["events"] if e["kind"] == "action"]
            assert actions == [{"kind": "action", "chunk": actions[0]["chunk"],
                                "frame": actions[0]["frame"], "keys": ["forward", "look_up"],
                                "pointer": [12.0, -3.0]}]
            picture = io.BytesIO()
            Image.fromarray(np.full((90, 160, 3), 200, np.uint8)).save(picture, format="PNG")
            answer = c.post(f"/api/sessions/{s['session_id']}/picture",
                            content=picture.getvalue(),
                            headers={"Authorization": f"Bearer {s['token']}",
                                     "Content-Type": "image/png"})
            assert answer.status_code == 200, answer.text
            assert (answer.json()["width"], answer.json()["height"]) == (48, 32)


def test_a_save_point_goes_through_the_http_routes_into_another_session(tmp_path):
    # room for a third state: the load makes one before it frees the session's old one
    with Engine(tiny_backend("universal", max_states=3), engine_config()) as engine:
        with TestClient(create_app(engine, ui=False, recording_dir=tmp_path)) as c:
            a, b = create(c), create(c)
            slot = engine.subscribe(a["session_id"])
            engine.set_paused(a["session_id"], False)  # as a viewer's connection does
            assert slot.get(timeout=120) is not None
            saved = c.get(f"/api/sessions/{a['session_id']}/state", headers=auth(a))
            assert saved.status_code == 200, saved.text
            meta = read_meta(saved.content)
            assert meta["model"] == "matrix-game-2:universal"
            assert meta["state"]["table"]["pages"] == 3 * len(meta["state"]["history"]) > 0
            r = c.post(f"/api/sessions/{b['session_id']}/state", content=saved.content,
                       headers={**auth(b), "Content-Type": "application/octet-stream"})
            assert r.status_code == 200, r.text
            assert r.json()["world_frames"] == meta["state"]["history"][-1]["position"] + 3
