"""The object table of game worlds on hand-worked frames (every answer counted by hand), on a
real env's play (the game against itself finds every object) and through ``evaluate``."""

import math

import numpy as np
import pytest

from worldstream.engine.evaluation.game import objects as go
from worldstream.engine.evaluation.game.sheet import outline_objects


def _frames(n: int, size: int = 12) -> np.ndarray:
    return np.zeros((n, size, size), np.uint8)  # colour 0: the background


def test_a_square_moved_by_one_pixel_is_one_object_of_its_colour():
    f = _frames(2, 8)
    f[:, 6, 0:4] = 5  # a static wall: never an object
    f[0, 2:4, 2:4] = 3  # a 2x2 square ...
    f[1, 2:4, 3:5] = 3  # ... one pixel to the right
    objects = go.moving_objects(f[:1], f[1:])
    assert len(objects) == 1 and objects.colour.tolist() == [3]
    # its new column only: the column it left turned background, which is no object
    assert np.argwhere(objects.labels[0] == 1).tolist() == [[2, 4], [3, 4]]


def test_objects_are_8_connected_and_split_by_colour():
    f = _frames(2)
    for i in range(4):
        f[1, 1 + i, 1 + i] = 2  # a diagonal line appears: one object
    f[1, 8, 8], f[1, 8, 9] = 4, 6  # two colours side by side: two objects
    f[1, 10, 1] = 2  # the line's colour, far off: its own object
    objects = go.moving_objects(f[:1], f[1:])
    assert sorted(objects.colour.tolist()) == [2, 2, 4, 6]
    sizes = np.bincount(objects.labels.ravel())[1:]
    assert sorted(sizes.tolist()) == [1, 1, 1, 4]


def test_background_is_each_frames_most_common_colour():
    f = _frames(2, 4)
    f[1] = 7
    f[1, 0, 0] = 1
    assert go.background(f).tolist() == [0, 7]
    # all but one pixel turned 7 (the background now): the one pixel of colour 1 is the object
    objects = go.moving_objects(f[:1], f[1:])
    assert objects.colour.tolist() == [1]


def _match(prev, a, b):
    return go.match(go.moving_objects(prev, a), go.moving_objects(prev, b))


@pytest.mark.parametrize(("offset", "found"), [(0, 1), (1, 1), (2, 1), (3, 0)])
def test_an_object_is_found_within_two_pixels_not_three(offset, found):
    prev, game, model = _frames(1), _frames(1), _frames(1)
    game[0, 5, 5] = 3  # a ball appears in the game
    model[0, 5 + offset, 5 - offset] = 3  # the model's ball, `offset` px off on both axes
    recall = _match(prev, game, model)
    assert (recall.objects, recall.found) == (1, found)
    precision = _match(prev, model, game)  # the other way round: the model's object
    assert (precision.objects, precision.found) == (1, found)
    wrong = model.copy()
    wrong[wrong == 3] = 4  # a ball of another colour is not the game's ball
    assert _match(prev, game, wrong).found == 0


def test_objects_are_matched_one_to_one():
    prev, game, model = _frames(1), _frames(1), _frames(1)
    game[0, 5, 4], game[0, 5, 7] = 3, 3  # two balls 3 px apart in the game
    model[0, 5, 5] = 3  # one model ball within 2 px of both: it stands for one of them
    assert (_match(prev, game, model).found, _match(prev, model, game).found) == (1, 1)
    model[0, 5, 9] = 3  # a second model ball, 2 px from the second game ball only
    assert _match(prev, game, model).found == 2
    # a chain the greedy choice gets wrong: game A near model 1 only; game B near 1 and 2
    game, model = _frames(1), _frames(1)
    game[0, 2, 2], game[0, 2, 6] = 3, 3
    model[0, 2, 4], model[0, 2, 8] = 3, 3  # model 1 at x=4 touches both; model 2 only B
    assert _match(prev, game, model).found == 2


def test_a_still_field_of_the_right_colour_recalls_nothing():
    """A grid of aliens that moves one pixel in the game; the model draws the grid and holds
    it: the colour is under every game object, but the model shows no moving object."""
    prev = _frames(1, 16)
    prev[0, 2:14:3, 2:14:3] = 5
    game = np.roll(prev, 1, axis=-1)
    assert _match(prev, game, prev).objects == 16
    assert _match(prev, game, prev).found == 0
    assert _match(prev, game, game).found == 16


def test_no_objects_pool_to_nan():
    still = _frames(3)
    assert _match(still[:1], still[1:2], still[2:]).objects == 0
    assert math.isnan(_match(still[:1], still[1:2], still[2:]).rate)
    assert math.isnan(go.play_figures(still[:1])["objects_per_frame"])


def test_births_on_a_hand_built_sequence():
    f = _frames(7)
    f[2, 2, 2] = 1  # t1: a ball appears where nothing moved before       -> birth
    f[3, 2, 3] = 1  # t2: it moves, its last move 1 px away                -> no birth
    f[4, 2, 4] = 1  # t3: it moves on                                      -> no birth
    f[4, 9, 9] = 2  #     and a shot appears far from any change           -> birth
    f[5, 2, 4] = 1  # t4: only the shot goes (turned background: no object)
    f[6, 2, 5] = 1  # t5: the ball moves after a still frame               -> birth
    figures = go.play_figures(f)
    # objects: t1 1, t2 1, t3 2, t5 1 over 6 transitions; births 3 over the 5 judged (t1-t5)
    assert figures["objects_per_frame"] == pytest.approx(5 / 6)
    assert figures["births_per_100"] == pytest.approx(100 * 3 / 5)
    judged = np.ones(6, bool)
    judged[3] = False  # leave out t3 (an env's reset, say)
    figures = go.play_figures(f, judged)
    assert figures["objects_per_frame"] == pytest.approx(3 / 5)
    assert figures["births_per_100"] == pytest.approx(100 * 2 / 4)


def _ball_rollout(h: int = 6) -> tuple[np.ndarray, ...]:
    """A ball moving 1 px right a frame: ``before`` x=2, ``last`` x=3, truth x=4.."""
    seq = _frames(h + 2, 16)
    for t in range(h + 2):
        seq[t, 7, 2 + t] = 1
    return seq[None, 0], seq[None, 1], seq[None, 2:]


def test_rollout_table_model_twin_and_copy_last():
    before, last, truth = _ball_rollout()
    perfect = go.rollout_table(before, last, truth, truth, (1, 4))
    assert perfect["object_recall_4"] == perfect["object_precision_4"] == 1.0
    assert perfect["gt_object_recall_1"] == perfect["gt_object_precision_4"] == 1.0
    assert perfect["game_objects_1"] == perfect["game_objects_4"] == 1
    # copy-last holds the ball at x=3: 1 px from the game's at k=1, 4 px at k=4
    assert perfect["copylast_object_recall_1"] == perfect["copylast_object_precision_1"] == 1.0
    assert perfect["copylast_object_recall_4"] == perfect["copylast_object_precision_4"] == 0.0
    late = np.roll(truth, -3, axis=-1)  # the model's ball 3 px behind
    table = go.rollout_table(before, last, truth, late, (1, 4))
    assert table["object_recall_1"] == table["object_precision_4"] == 0.0
    frozen = np.repeat(last[:, None], truth.shape[1], 1)  # a model that never moves
    assert math.isnan(go.rollout_table(before, last, truth, frozen, (4,))["object_precision_4"])
    with pytest.raises(ValueError, match="horizon 16"):
        go.rollout_table(before, last, truth, truth, (16,))


def test_the_games_twin_finds_every_object_in_real_play():
    from tests.fixtures.tiny_game import TINY
    from worldstream.engine.evaluation.game.episodes import held_out
    from worldstream.engine.models.game.palette import Palette
    from worldstream.engine.worlds.game.env import GameEnv

    game = GameEnv(TINY, size=16)
    trajs = [t for t in (held_out(game, i, 18) for i in range(4)) if len(t.frames) == 18]
    game.close()
    palette = Palette.fit(np.concatenate([t.frames for t in trajs]))
    index = np.stack([palette.encode(t.frames) for t in trajs])
    table = go.rollout_table(index[:, 0], index[:, 1], index[:, 2:], index[:, 2:], (1, 4, 16))
    for k in (1, 4, 16):
        assert table[f"game_objects_{k}"] >= 3  # the ball moves in every frame
        assert table[f"gt_object_recall_{k}"] == table[f"gt_object_precision_{k}"] == 1.0
    figures = go.play_figures(index[0])
    assert figures["objects_per_frame"] >= 1.0


def test_the_sheet_outlines_each_moving_object():
    prev = np.zeros((8, 8, 3), np.uint8)
    cur = prev.copy()
    cur[3, 3] = (255, 0, 255)  # a magenta ball appears: the outline is another colour
    out = outline_objects(prev, cur)
    ring = np.ones((8, 8), bool)
    ring[2:5, 2:5] = False
    assert (out[ring] == 0).all()
    assert (out[3, 3] == (255, 0, 255)).all()  # the object itself is untouched
    around = out[2:5, 2:5].reshape(-1, 3)[[0, 1, 2, 3, 5, 6, 7, 8]]
    assert (around == around[0]).all() and around[0].tolist() in ([0, 255, 255],
                                                                   [255, 255, 255])


def test_evaluate_reports_the_object_table():
    """Through ``evaluate`` with an untrained tiny world on the tiny game (with a latent, as
    the recipe's default, fed its prior mean at play): every key, the twins at 1.0."""
    import torch

    from tests.fixtures.tiny_game import TINY
    from worldstream.engine.evaluation.game.evaluate import GameEvalConfig, evaluate
    from worldstream.engine.models.game.palette import Palette
    from worldstream.engine.models.game.unet import GameUNet
    from worldstream.engine.models.game.world import GameWorld

    torch.manual_seed(0)
    unet = GameUNet(num_colours=3, num_actions=3, context=4, channels=(8, 16), size=16,
                    latent_dim=4).eval()
    palette = Palette(np.array([[0, 0, 80], [200, 200, 0], [255, 255, 255]], np.uint8))
    world = GameWorld(unet, palette, TINY, 16, ("NOOP", "LEFT", "RIGHT"), 1.0)
    # few model steps: one rollout start of 16 frames, 40 frames of free play
    cfg = GameEvalConfig(episodes=1, length=40, horizons=(16,), effect_states=0, free_play=40)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny network: one thread is fastest, and on a busy CPU
    try:
        result, _ = evaluate(world, cfg)
    finally:
        torch.set_num_threads(threads)
    for k in (1, 4, 16):
        assert result[f"gt_object_recall_{k}"] == result[f"gt_object_precision_{k}"] == 1.0
        for key in (f"object_recall_{k}", f"object_precision_{k}",
                    f"copylast_object_recall_{k}", f"copylast_object_precision_{k}"):
            assert result[key] is None or 0.0 <= result[key] <= 1.0
    assert result["gt_objects_ratio"] == 1.0  # the ball moves in every frame
    assert result["gt_births_ratio"] == (1.0 if result["gt_births_per_100"] else None)
    for key in ("change_rate_ratio", "objects_ratio", "births_ratio", "objects_per_frame",
                "births_per_100", "gt_objects_per_frame", "gt_births_per_100"):
        assert key in result


def test_results_table_shows_the_object_rows_with_copy_last_and_twin():
    from worldstream.bench.report_games import render_games

    ev = {"env": "ALE/Breakout-v5", "object_recall_4": 0.85, "copylast_object_recall_4": 0.7,
          "gt_object_recall_4": 1.0, "object_precision_4": 0.5,
          "copylast_object_precision_4": None, "gt_object_precision_4": 1.0,
          "objects_ratio": 1.2, "gt_objects_ratio": 1.0, "births_ratio": 0.5,
          "gt_births_ratio": 1.0}
    text = render_games({"breakout": {"eval": ev, "training": {}, "source": "x"}})
    rows = {line.split(" | ")[0].strip("| "): line for line in text.splitlines()}
    assert "| 0.850 (0.70 / 1.00) |" in rows["object recall at 4 frames"]
    assert "0.500 (— / 1.00) **miss**" in rows["object precision at 4 frames"]
    assert "**miss**" not in rows["free-play moving objects per frame vs the env's (x)"]
    assert "**miss**" in rows["free-play births per 100 frames vs the env's (x)"]
