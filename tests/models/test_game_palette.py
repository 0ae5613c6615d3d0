"""A game's palette: fitted from frames, exact for its colours, nearest for others."""

import numpy as np

from worldstream.engine.models.game.palette import Palette


def test_fit_orders_by_frequency_and_round_trips():
    frames = np.zeros((2, 4, 4, 3), np.uint8)
    frames[:, :, :2] = (10, 20, 30)
    frames[0, 0, 0] = (200, 0, 0)
    pal = Palette.fit(frames)
    assert pal.colours.tolist() == [[0, 0, 0], [10, 20, 30], [200, 0, 0]]
    assert (pal.decode(pal.encode(frames)) == frames).all()


def test_unknown_colours_go_to_the_nearest_and_a_cap_keeps_the_most_frequent():
    pal = Palette(np.array([[0, 0, 0], [255, 255, 255]], np.uint8))
    assert pal.encode(np.array([[[20, 20, 20], [240, 200, 250]]], np.uint8)).tolist() == [[0, 1]]
    frames = np.zeros((1, 1, 10, 3), np.uint8)
    frames[0, 0, :6] = 5
    frames[0, 0, 6:9] = 9
    assert len(Palette.fit(frames, max_colours=2)) == 2


def test_encoding_a_many_coloured_game_matches_the_nearest_colour_per_pixel():
    """Frames with thousands of colours outside the palette (a textured game such as
    crafter) encode to each pixel's nearest palette colour, as a per-pixel search finds it."""
    rng = np.random.default_rng(3)
    frames = rng.integers(0, 256, (6, 16, 16, 3), dtype=np.uint8)
    palette = Palette(rng.integers(0, 256, (24, 3), dtype=np.uint8))
    rgb = frames.reshape(-1, 3).astype(np.int32)
    expect = ((rgb[:, None] - palette.colours[None].astype(np.int32)) ** 2).sum(-1).argmin(1)
    assert np.array_equal(palette.encode(frames), expect.reshape(6, 16, 16))
