"""Scaling game frames: small objects survive, only the game's colours come out."""

import numpy as np
import pytest

from worldstream.engine.worlds.game.frames import colour_codes, lost_colours, scale_frame


def test_a_one_pixel_ball_survives_a_4x_downscale_in_its_own_cell():
    frame = np.zeros((64, 64, 3), np.uint8)
    frame[..., 2] = 90  # background
    frame[41, 22] = (250, 250, 250)  # the ball: cell (41 // 4, 22 // 4)
    small = scale_frame(frame, 16)
    ball = np.argwhere((small == 250).all(-1))
    assert ball.tolist() == [[10, 5]]
    assert lost_colours(frame, small) == 0


def test_output_colours_are_a_subset_of_the_input_colours_for_uneven_cells():
    rng = np.random.default_rng(0)
    palette = rng.integers(0, 256, (5, 3), dtype=np.uint8)
    frame = palette[rng.integers(0, 5, (210, 160))]
    small = scale_frame(frame, 64)
    assert small.shape == (64, 64, 3)
    assert set(np.unique(colour_codes(small))) <= set(np.unique(colour_codes(frame)))


def test_same_size_is_a_copy_and_bad_frames_are_refused():
    frame = np.arange(8 * 8 * 3, dtype=np.uint8).reshape(8, 8, 3)
    assert (scale_frame(frame, 8) == frame).all()
    with pytest.raises(ValueError, match="uint8"):
        scale_frame(frame.astype(np.float32), 4)


def test_breakout_frames_keep_every_colour_at_64_pixels():
    """Measured on the env's own frames: the ball and every brick row keep a pixel."""
    from worldstream.engine.worlds.game.env import GameEnv

    game = GameEnv("ALE/Breakout-v5", size=64)
    game.reset(0)
    lost = 0
    for t in range(120):
        game.step(1 if t % 20 == 0 else (2 if t % 40 < 20 else 3))
        lost += lost_colours(game.raw, game.frame) > 0
    game.close()
    assert lost == 0
