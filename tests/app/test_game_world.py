"""A game world through the server and the CLI: the game's own keys on the wire (other
worlds' unchanged), its controls for the page, the episode event, ``worldstream record`` (by
policy and ``--from-log``) and one-line refusals of bad input (exit 2, nothing written)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from fastapi.testclient import TestClient

from tests.fixtures.games import CONTINUOUS, NO_IMAGE, SHORT
from tests.fixtures.server import create, ws_url
from worldstream.app.cli import main
from worldstream.app.cmd_play import play_config
from worldstream.app.server import create_app
from worldstream.engine.backends.game.sim import GameEnvBackend
from worldstream.engine.core.engine import Engine
from worldstream.engine.worlds.game import dataset
from worldstream.streaming import messages as m
from worldstream.streaming.websocket import unpack_frame


def test_the_wire_takes_a_games_keys_and_nothing_else_changes():
    action = {"type": "action", "seq": 1, "t": 0}
    game = ("fire", "left", "right")
    msg = m.parse_client_message(json.dumps({**action, "keys": ["fire", "left"]}), game)
    assert m.to_command(msg).keys == {"fire", "left"}
    for keys, context, expected in ((["up"], game, "'fire', 'left' or 'right'"),
                                    (["fire"], None, "'up', 'down', 'left' or 'right'"),
                                    ([1], game, "'fire', 'left' or 'right'")):
        with pytest.raises(m.MessageError) as err:
            m.parse_client_message(json.dumps({**action, "keys": keys}), context)
        assert (err.value.code, err.value.field) == ("literal_error", "keys.0")
        assert err.value.reason == f"Input should be {expected}"
    with pytest.raises(m.MessageError, match="keys: List should have at most 4"):
        m.parse_client_message(json.dumps({**action, "keys": ["a", "b", "c", "d", "e"]}), game)


def _receive_until(ws, want, limit=200):
    """Messages until ``want(msg)``: text ones, and the header of each binary frame (one
    credit returned for each)."""
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


def test_a_game_session_over_the_websocket(tmp_path):
    backend = GameEnvBackend(env=SHORT, size=16)  # episodes of 12 frames
    with Engine(backend, play_config(max_sessions=2)) as engine:
        app = create_app(engine, ui=False, recording_dir=tmp_path)
        with TestClient(app) as c:
            controls = c.get("/api/controls").json()
            assert controls["world"] == "game" and controls["env"] == SHORT
            assert controls["keys"] == {"ArrowLeft": "left", "KeyA": "left",
                                        "ArrowRight": "right", "KeyD": "right"}
            assert controls["actions"] == {"": "NOOP", "left": "LEFT", "right": "RIGHT"}
            s = create(c)
            assert (s["width"], s["height"]) == (16, 16)
            with c.websocket_connect(ws_url(s)) as ws:
                ws.send_text('{"type":"next"}')
                ws.send_text(json.dumps({"type": "action", "seq": 1, "t": 0, "keys": ["up"]}))
                err = _receive_until(ws, lambda msg: msg["type"] == "error")
                assert (err["code"], err["field"]) == ("literal_error", "keys.0")
                ws.send_text(json.dumps({"type": "action", "seq": 2, "t": 0,
                                         "keys": ["right"]}))
                ws.send_text(json.dumps({"type": "prompt", "seq": 3, "t": 0, "text": "snow"}))
                err = _receive_until(ws, lambda msg: msg["type"] == "error")
                assert "no text prompt" in err["message"]
                event = _receive_until(ws, lambda msg: msg.get("kind") == "episode")
                assert event["reason"] == "game over" and event["episode"] == 1
                _receive_until(ws, lambda msg: msg["type"] == "frame" and msg["action_seq"] == 2)


def test_a_game_session_needs_no_prompt(tmp_path, fake_engine):
    backend = GameEnvBackend(env=SHORT, size=16)
    with Engine(backend, play_config(max_sessions=4)) as engine:
        with TestClient(create_app(engine, ui=False, recording_dir=tmp_path)) as c:
            for body in ({"prompt": ""}, {}, {"seed": 3}, {"prompt": " "}):
                r = c.post("/api/sessions", json=body)
                assert r.status_code == 201, (body, r.json())
    # a world that takes text still needs one
    with TestClient(create_app(fake_engine, ui=False, recording_dir=tmp_path)) as c:
        for body in ({"prompt": ""}, {}, {"prompt": "  "}):
            r = c.post("/api/sessions", json=body)
            assert (r.status_code, r.json()["field"]) == (400, "prompt"), body


def test_the_game_page_has_controls_and_no_prompt():
    from worldstream.app.ui import _player_html

    page = _player_html("game")
    assert 'id="ws-controls-list"' in page and 'data-world="game"' in page
    assert 'id="ws-prompt"' not in page and 'id="ws-story-play"' not in page
    assert 'id="ws-save"' in page and 'id="ws-log-export"' in page
    assert 'id="ws-prompt"' in _player_html("landscape")


def test_record_writes_a_readable_dataset(tmp_path, capsys):
    out = tmp_path / "breakout"
    assert main(["record", "--env", "ALE/Breakout-v5", "--frames", "400", "--workers", "2",
                 "--shard-frames", "100", "--seed", "3", "--out", str(out)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["shards"] == 4 and printed["frames"] == 400
    meta, episodes = dataset.load(out, env_id="ALE/Breakout-v5")
    assert episodes.frames.shape == (400, 64, 64, 3) and episodes.frames.dtype == np.uint8
    assert meta["action_meanings"] == ["NOOP", "FIRE", "RIGHT", "LEFT"]
    assert set(np.unique(episodes.actions)) <= {-1, 0, 1, 2, 3}
    assert not (tmp_path / "breakout.partial").exists()


def test_record_from_a_logged_session(tmp_path, capsys):
    from tests.studio.test_replay import record_session
    from worldstream.engine.core.api import ActionCommand, RewindCommand
    from worldstream.engine.core.config import EngineConfig

    plan = [(2, ActionCommand(1, 0.0, frozenset({"fire"}))),
            (6, ActionCommand(2, 0.0, frozenset({"left"}))), (14, RewindCommand(3, 2))]
    config = EngineConfig(max_sessions=1, fps=60, chunk_frames=2)
    with Engine(GameEnvBackend(env="ALE/Breakout-v5"), config) as engine:
        original, log = record_session(engine, "play", 1, plan, 30)
    path = tmp_path / "session.log.json"
    path.write_text(json.dumps(log))
    out = tmp_path / "mine"
    assert main(["record", "--from-log", str(path), "--out", str(out)]) == 0
    meta, episodes = dataset.load(out, env_id="ALE/Breakout-v5")
    assert meta["policy"] == "log" and meta["shards"] == 2  # the rewind cut the stream
    assert meta["frames"] == len(original) + 2
    # a replay of the same log through the CLI makes an MP4 of the same length
    mp4 = tmp_path / "replay.mp4"
    assert main(["generate", "--replay", str(path), "--out", str(mp4)]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["frames"] == len(original)


@pytest.mark.parametrize("argv, message", [
    (["record", "--env", "ALE/NoSuchGame-v5", "--frames", "10"], "unknown env id"),
    (["record", "--env", CONTINUOUS, "--frames", "10"], "discrete"),
    (["record", "--env", NO_IMAGE, "--frames", "10"], "no image observation"),
    (["record", "--from-log", "{tmp}/nope.json"], "input log not found"),
    (["play", "--env", SHORT, "--keymap", "{tmp}/bad.json"], "'JUMP', which env"),
    (["play", "--env", SHORT, "--world", "pong"], "exclude each other"),
    (["play", "--keymap", "{tmp}/bad.json"], "--keymap goes with a game world"),
])
def test_bad_input_is_one_line_and_exit_2(argv, message, tmp_path, capsys):
    (tmp_path / "bad.json").write_text(json.dumps(
        {"keys": {"Space": "fire"}, "actions": {"fire": "JUMP"}}))
    out = tmp_path / "out"
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    assert main([*argv, *(["--out", str(out)] if argv[0] == "record" else [])]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not out.exists() and not (tmp_path / "out.partial").exists()


def test_record_refuses_an_out_that_is_not_empty(tmp_path, capsys):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    assert main(["record", "--env", SHORT, "--frames", "10", "--out",
                 str(tmp_path / "out")]) == 2
    assert "not an empty folder" in capsys.readouterr().err
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["keep.txt"]
