"""The as-played evaluation's parts, hand-worked, and the whole of it with the game standing in
for the model (every ratio is then 1: the metrics are sound on ground truth)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.fixtures.tiny_game import TINY
from worldstream.engine.evaluation.game import objects as go
from worldstream.engine.evaluation.game import played as pl
from worldstream.engine.models.game.palette import Palette
from worldstream.engine.models.game.unet import CodePrior
from worldstream.engine.models.game.world import frame_draws
from worldstream.engine.worlds.game.env import GameEnv


def _frames(t: int, size: int = 12) -> np.ndarray:
    return np.zeros((t, size, size), np.uint8)


def test_an_object_that_appears_is_born_and_one_that_starts_moving_is_not():
    f = _frames(6)
    f[:, 5, 2:5] = 1  # a paddle, still for three frames, then moving right
    f[3:, 5, 2:5] = 0
    f[3:, 5, 3:6] = 1
    f[4:, 5, 3:6] = 0
    f[4:, 5, 4:7] = 1
    f[4:, 9, 9] = 2  # a ball appears in transition 3 (frame 3 -> 4)
    born = go.births(f)
    assert born.tolist() == [0, 0, 0, 1, 0]


def test_the_score_band_is_what_changes_when_the_game_scores():
    f = _frames(40)
    f[:, 8, :] = 3  # a line that never changes
    for t in range(40):
        f[t, 6, t % 12] = 1  # a ball crossing the field every frame
    rewards = np.zeros((1, 39))
    for k, t in enumerate((9, 24)):
        rewards[0, t] = 1
        f[t + 1:, 0, 0:2] = 4 + k  # the digit redrawn one frame after the reward
    plays = pl.Plays(f[None], f[None], np.ones((1, 39), bool), rewards, np.zeros(1), 0, [])
    band = pl.score_band(plays)
    assert band.sum() == 2 and band[0, :2].all()
    assert pl.score_changes(f[None], np.ones((1, 39), bool), band) == 2
    still = f.copy()
    still[:, 0, :2] = 4
    assert pl.score_changes(still[None], np.ones((1, 39), bool), band) == 0


def test_cleared_counts_what_turns_to_background_and_stays():
    f = _frames(60)
    f[:, 1, :] = 5  # a row of bricks
    f[20:, 1, 3:6] = 0  # three broken at frame 20, for good
    f[30:33, 1, 8] = 0  # one flickers: not broken
    judged = np.ones((1, 59), bool)
    assert pl.cleared(f[None], judged, 0) == 3
    # a reset at transition 39 (frame 40 a new episode: the bricks are back) starts anew
    g = f.copy()
    g[40:, 1, :] = 5
    judged[0, 39] = False
    assert pl.cleared(g[None], judged, 0) == 3
    # the keys' object vanishing (a paddle on the bottom row) breaks nothing
    h = f.copy()
    h[:, 10, 2:6] = 7
    h[25:, 10, 2:6] = 0
    keys = np.zeros(h.shape[1:], bool)
    keys[9:12, :] = True  # the keys' locus, dilated by 2 px
    assert pl.cleared(h[None], np.ones((1, 59), bool), 0) == 3 + 4
    assert pl.cleared(h[None], np.ones((1, 59), bool), 0, keys) == 3
    # a ball crossing a hole for 2 frames leaves it cleared; an object back in its first place
    # for 3 (a paddle that wandered off and returned) was never cleared
    k = f.copy()
    k[40:42, 1, 4] = 5
    k[:, 11, 7:9] = 6
    k[5:50, 11, 7:9] = 0
    k[50:53, 11, 7:9] = 6
    assert pl.cleared(k[None], np.ones((1, 59), bool), 0) == 3


def test_the_code_prior_draws_by_inverse_cdf_from_its_uniforms():
    prior = CodePrior(num_colours=2, num_actions=2, context=1, grid=1, classes=3, size=4)
    logits = torch.log(torch.tensor([[[0.5, 0.25, 0.25]]])).repeat(3, 1, 1)
    u = torch.tensor([[0.4], [0.6], [0.8]])
    assert prior.sample(logits, u).ravel().tolist() == [0, 1, 2]
    assert prior.sample(logits, None).ravel().tolist() == [0, 0, 0]
    # the uniforms are a function of the session's seed and the frame's index alone
    a = frame_draws(np.array([7, 7, 8]), np.array([0, 1, 0]), 16)
    b = frame_draws(np.array([8, 7]), np.array([0, 1]), 16)
    assert torch.equal(a[2], b[0]) and torch.equal(a[1], b[1]) and not torch.equal(a[0], a[1])


def test_the_game_against_itself_scores_one(monkeypatch):
    """The model side replaced by the game's own play of the same sessions."""
    game = GameEnv(TINY, size=16)
    palette = Palette.fit(np.stack([game.reset(0)] + [game.step(2) for _ in range(30)]))
    cfg = pl.PlayedConfig(seeds=3, seconds=12.0, fps=15, probes=9)
    world = type("W", (), {"context": 2, "palette": palette})()

    def game_side(world_, start, actions, seeds):
        return np.stack([palette.encode(np.stack(pl.play_game(
            GameEnv(TINY, size=16), int(s), pl.POLICIES["taps"], actions.shape[1] - 1, 2,
            0)[0])) for s in seeds])

    monkeypatch.setattr(pl, "play_model", game_side)
    plays = pl.play(world, game, cfg, "taps")
    assert np.array_equal(plays.model, plays.game)
    control = pl.find_controlled(world, game, plays)
    # the paddle is what the keys move: its colour, on the bottom row
    paddle = palette.encode(np.full((1, 1, 3), (200, 200, 0), np.uint8))[0, 0]
    assert control is not None and control.colours.tolist() == [paddle]
    assert control.locus[15].any() and not control.locus[:14].any()
    out = pl.figures(plays, control, pl.score_band(plays), cfg.fps, cfg.seconds,
                     len(palette))
    assert out["played_control"] == 1.0 and out["played_control_ratio"] == 1.0
    assert out["played_objects_ratio"] == 1.0 and out["played_motion_ratio"] == 1.0
    births = out["played_births_ratio"]
    assert births == 1.0 or (np.isnan(births) and out["gt_played_births_per_100"] == 0)
    assert out["played_first_birth_s"] == out["gt_played_first_birth_s"]
    game.close()


def test_class_motion_follows_a_marching_object_and_not_a_flickering_one():
    frames = np.zeros((5, 8, 12), np.uint8)
    for t in range(5):
        frames[t, 2, 2 + t] = 2  # colour 2 steps 1 px right a frame
        if t % 2 == 0:
            frames[t, 6, 6] = 3  # colour 3 flickers in place
    motion = pl.class_motion(frames, np.ones(4, bool), 4)
    # colour 2's moving pixel is the ball's new position: x = 3, 4, 5, 6 on transitions 0-3;
    # 1 px between each pair of successive transitions, 3 pairs over 4 judged transitions
    assert motion[2] == pytest.approx(3 / 4)
    assert motion[3] == 0.0 and motion[0] == 0.0
    held = np.repeat(frames[:1], 5, 0)  # a model that holds the first frame: nothing moves
    assert pl.class_motion(held, np.ones(4, bool), 4)[2] == 0.0
    judged = np.array([True, True, False, True])  # a transition left out is not counted
    assert pl.class_motion(frames, judged, 4)[2] == pytest.approx(2 / 3)


def test_the_worst_ratio_is_the_one_farthest_from_one():
    assert pl.worst([1.2, 0.5, float("nan"), None]) == 0.5
    assert pl.worst([1.2, 3.0]) == 3.0 and pl.worst([0.0, 100.0]) == 0.0
    assert np.isnan(pl.worst([float("nan")]))
