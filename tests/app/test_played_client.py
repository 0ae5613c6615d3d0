"""``bench played_client``'s WebSocket client against the real server: ``worldstream play`` of
the tiny game (``--model sim``) in a process of its own, two sessions of one seed driven by the
eval's tapping player."""

from __future__ import annotations

import asyncio
import os

import httpx
import numpy as np
import pytest

from tests.fixtures.tiny_game import TINY
from worldstream.bench import played_client as pc
from worldstream.bench.adversarial import PlayServer
from worldstream.engine.models.game.palette import Palette

MEANINGS = ("NOOP", "LEFT", "RIGHT")
SEED, FRAMES = 1_500_000, 45
#: frames the server may generate before the session's first action arrives (the start race)
START_RACE = 2


@pytest.fixture(scope="module")
def recordings():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    path = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    with pytest.MonkeyPatch.context() as patch:  # the server imports the tiny game's module
        patch.setenv("PYTHONPATH", path)
        server = PlayServer("sim", 2, 1, ["--env", TINY])
    with server:
        keys = pc.wire_keys(httpx.get(f"{server.url}/api/controls", timeout=10).json(),
                            MEANINGS)
        acts = pc.player_actions(MEANINGS, SEED, FRAMES)
        got = [asyncio.run(pc.record(server.url, SEED, acts, keys)) for _ in range(2)]
    return acts, got


def test_keys_and_player():
    controls = {"env": TINY, "actions": {"": "NOOP", "left": "LEFT", "right": "RIGHT",
                                         "left+right": "LEFT"}}
    assert pc.wire_keys(controls, MEANINGS) == [[], ["left"], ["right"]]
    with pytest.raises(ValueError, match="RIGHT"):
        pc.wire_keys({"actions": {"": "NOOP", "left": "LEFT"}}, MEANINGS)
    a = pc.player_actions(MEANINGS, SEED, 200)
    assert a == pc.player_actions(MEANINGS, SEED, 200) != pc.player_actions(MEANINGS, 1, 200)
    assert set(a) == {0, 1, 2}  # taps of both keys with gaps


def test_two_sessions_of_one_seed_are_the_game(recordings):
    acts, (a, b) = recordings
    size = a.frames[0].shape[0]
    palette = Palette.fit(np.stack(pc.replay_game(TINY, size, SEED, [0] * 5, 5)[0]))
    frames = []
    for rec in (a, b):
        assert len(rec.frames) == FRAMES and rec.index == list(range(FRAMES)) and not rec.errors
        # lockstep after the start: frame k answers the keys sent after frame k - 1 (a loaded
        # machine may answer a frame late now and then)
        assert np.mean(np.array(rec.played[START_RACE:]) == acts[START_RACE:]) >= 0.9
        # what came over the wire is the game played with the actions the headers name
        replayed, _ = pc.replay_game(TINY, size, SEED, rec.played, 10)
        idx = palette.encode(np.stack(rec.frames))
        assert np.array_equal(idx, palette.encode(replayed))
        if rec.played == acts:  # no start race: the eval's own game, frame for frame
            same = pc.as_eval_game(TINY, size, SEED, FRAMES, 1, palette, idx, rec.played)
            assert same == {"frames_same_s": FRAMES / pc.FPS, "actions_same_s": FRAMES / pc.FPS}
        frames.append(idx)
    # the two recordings agree wherever they were played alike
    same = next((k for k, (p, q) in enumerate(zip(a.played, b.played)) if p != q), FRAMES)
    assert np.array_equal(frames[0][:same], frames[1][:same])
    # the figures of one session against the game replayed in-process: ratio 1
    replayed = palette.encode(pc.replay_game(TINY, size, SEED, a.played, 10)[0])
    figures, _ = pc.judge([frames[0]], [replayed], palette, 2, [SEED], pc.FPS, FRAMES / pc.FPS)
    assert figures["played_objects_per_class"]  # the ball moves
    assert figures["played_objects_ratio"] == figures["played_motion_ratio"] == 1.0
    # and against the other session: the same game up to the start race
    other, _ = pc.judge([frames[0]], [frames[1]], palette, 2, [SEED], pc.FPS, FRAMES / pc.FPS)
    assert 0.8 <= other["played_objects_ratio"] <= 1.25


def test_centres_of_an_upscaled_frame():
    small = np.random.default_rng(0).integers(0, 255, (16, 16, 3), dtype=np.uint8)
    big = small.repeat(4, 0).repeat(4, 1)  # the server scales up by 4, nearest neighbour
    assert np.array_equal(pc.centres(big, 16), small)
    with pytest.raises(ValueError, match="multiple"):
        pc.centres(big[:60, :60], 16)


def test_steady_keeps_codec_noise_out_of_moving_objects():
    palette = Palette(np.array([[0, 0, 0], [200, 0, 0], [0, 0, 200]], np.uint8))
    reads = np.zeros((3, 8, 8, 3), np.uint8)
    reads[:, 2, 2] = (100, 0, 0)    # between black and red: noise flips its nearest class
    reads[1, 2, 2] = (104, 0, 0)
    reads[2, 5, 5] = (0, 0, 200)    # a real object arrives
    idx = pc.steady(reads, palette)
    assert palette.encode(reads)[0, 2, 2] != palette.encode(reads)[1, 2, 2]
    assert (idx[:, 2, 2] == idx[0, 2, 2]).all() and idx[2, 5, 5] == 2
    assert pc.per_class(idx, 3).tolist() == [0.0, 0.0, 0.5]
