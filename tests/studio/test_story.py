"""Storyboards: the schema's one-line errors name the beat and the field; a story compiles to
input-log events at hand-worked chunks; headless (``worldstream generate --story``) writes an
MP4 of the story's length whose beats show their scenes; played live in the engine it makes
the same frames as headless."""

from __future__ import annotations

import json
import time

import av
import numpy as np
import pytest

from worldstream.app import cli
from worldstream.engine.backends.sim.backend import SimBackend
from worldstream.engine.core.config import EngineConfig
from worldstream.engine.core.engine import Engine
from worldstream.engine.core.inputlog import parse_log
from worldstream.engine.studio import worldio
from worldstream.engine.studio.replay import replay
from worldstream.engine.studio.savepoint import model_version
from worldstream.engine.studio.story import compile_story, parse_story, story_from_data, story_log

THREE = {"seed": 4, "beats": [
    {"prompt": "a green meadow with ponds", "duration_s": 2,
     "actions": [{"at_s": 0.5, "keys": ["right"]}]},
    {"prompt": "a snowy forest", "duration_s": 3, "transition_s": 1},
    {"prompt": "hot desert dunes", "duration_s": 1, "cut": True,
     "blend": {"text": "a snowy forest", "weight": 0.25}},
]}


@pytest.mark.parametrize(("change", "message"), [
    ({"beats": []}, "storyboard: beats: List should have at least 1 item"),
    ({"beats": [{"prompt": "x", "duration_s": 0}]}, "beat 1, duration_s: Input should be greater"),
    ({"beats": [THREE["beats"][0], {"prompt": "", "duration_s": 1}]}, "beat 2, prompt: String"),
    ({"beats": [THREE["beats"][0], {"prompt": "a", "duration_s": 1, "transition_s": 2}]},
     "beat 2: transition_s \\(2.0\\) is longer than duration_s"),
    ({"beats": [{"prompt": "a", "duration_s": 1, "actions": [{"at_s": 0, "keys": ["jump"]}]}]},
     "beat 1, actions.0.keys.0: Input should be"),
    ({"beats": [{"prompt": "a", "duration_s": 1, "colour": "red"}]},
     "beat 1, colour: Extra inputs are not permitted"),
    ({"beats": [{"prompt": "a", "duration_s": "5"}]}, "beat 1, duration_s: Input should be"),
    ({"beats": [{"prompt": "a", "duration_s": 400}, {"prompt": "b", "duration_s": 300}]},
     "the story lasts 700 s"),
])
def test_bad_storyboards_get_one_line_naming_beat_and_field(change, message):
    with pytest.raises(ValueError, match=message) as err:
        story_from_data({**THREE, **change})
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="storyboard: not valid JSON"):
        parse_story(b'{"beats": [')


def test_compile_places_events_at_hand_worked_chunks():
    # fps 10, chunks of 2 frames: beat 2 starts at frame 20 (chunk 10), beat 3 at frame 50
    events, beat_chunks, chunks = compile_story(story_from_data(THREE), fps=10, chunk_frames=2)
    assert beat_chunks == [0, 10, 25] and chunks == 30
    got = [(e["kind"], e["chunk"], e.get("blend_weight", e.get("keys", e.get("seed"))))
           for e in events]
    assert got == [
        ("action", 2, ["right"]),                     # 0.5 s: frame 5, in chunk 2
        ("prompt", 10, 0.2), ("action", 10, []),      # transition: 4 steps of 1/4 s
        ("prompt", 11, 0.4), ("prompt", 12, 0.6), ("prompt", 13, 0.8),  # frames 22, 25, 27
        ("prompt", 15, 0.0),                          # then the beat's own prompt, at 1 s
        ("cut", 25, 6), ("prompt", 25, 0.25), ("action", 25, []),
    ]
    assert events[1]["text"] == "a green meadow with ponds"
    assert events[1]["blend_text"] == "a snowy forest"
    assert events[6]["text"] == "a snowy forest" and events[6]["blend_text"] is None


def test_headless_story_writes_the_story_length_and_shows_each_scene(tmp_path, capsys):
    story = tmp_path / "story.json"
    story.write_text(json.dumps(THREE))
    out = tmp_path / "story.mp4"
    assert cli.main(["generate", "--story", str(story), "--model", "sim", "--fps", "10",
                     "--out", str(out), "--score"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["frames"] == 60 and summary["seconds"] == 6.0
    with av.open(str(out)) as container:
        assert sum(1 for _ in container.decode(video=0)) == 60
    # the simulator cross-fades a switch over 12 frames: 1-2 s after a start, its new scene
    scores = summary["scene_accuracy"]
    assert [s["scene"] for s in scores] == ["meadow", "snow", "desert"]
    assert scores[0]["accuracy"] == scores[1]["accuracy"] == 1.0
    assert scores[2]["accuracy"] is None  # a 1 s beat has no frames 1-2 s after its start
    # the log written beside it replays to the same MP4 frames
    assert json.loads(out.with_suffix(".story.json").read_text())["seed"] == 4
    replayed = tmp_path / "replayed.mp4"
    assert cli.main(["generate", "--replay", str(out.with_suffix(".log.json")),
                     "--out", str(replayed)]) == 0
    with av.open(str(out)) as a, av.open(str(replayed)) as b:
        for fa, fb in zip(a.decode(video=0), b.decode(video=0), strict=True):
            assert np.array_equal(fa.to_ndarray(format="rgb24"), fb.to_ndarray(format="rgb24"))


@pytest.mark.slow
def test_a_story_played_live_makes_the_headless_frames():
    story = story_from_data(THREE)
    backend = SimBackend()
    with Engine(backend, EngineConfig(max_sessions=2, fps=30, chunk_frames=2)) as engine:
        sid = engine.create_session("a dark landscape at night", seed=1).session_id
        slot = engine.subscribe(sid, maxlen=10_000)
        events = engine.events(sid)
        started = worldio.play_story(engine, sid, story).result(timeout=60)
        frames, beats, deadline = {}, [], time.monotonic() + 300
        while not beats or beats[-1].get("done") is None:
            assert time.monotonic() < deadline
            while (frame := slot.get_nowait()) is not None:
                frames[frame.index] = frame.rgb
            while not events.empty():
                event = events.get_nowait()
                if event.kind == "story":
                    beats.append(event.payload)
            time.sleep(0.01)
        live_log = worldio.export_log(engine, sid).result(timeout=60)
    assert [b.get("beat") for b in beats] == [0, 1, 2, None]
    start = started["frame_index"]
    live = np.stack([frames[start + i] for i in range(started["frames"])])
    headless = []
    log = story_log(story, model="sim", model_version=model_version(backend), fps=30,
                    chunk_frames=2, steps=4)
    replay(backend, parse_log(json.dumps(log)), headless.append)
    assert np.array_equal(live, np.concatenate(headless))
    # and the live session's own log names the story's events
    assert [e["kind"] for e in live_log["events"]].count("cut") == 1
