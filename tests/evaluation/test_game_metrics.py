"""Game-world metrics on hand-worked cases and on the game against itself."""

import numpy as np
import pytest

from worldstream.engine.evaluation.game import metrics as gm


def test_psnr_hand_worked_and_capped_for_identity():
    a = np.zeros((2, 2, 2, 3), np.uint8)
    b = a.copy()
    b[0, 0, 0] = 255  # one of 8 pixels off by 255 in every channel
    assert gm.pooled_psnr(b, a) == pytest.approx(10 * np.log10(8))
    assert gm.pooled_psnr(a, a) == gm.PSNR_CAP
    changed = np.zeros((2, 2, 2), bool)
    changed[0, 0, 0] = True
    assert gm.pooled_psnr(b, a, changed) == pytest.approx(0.0)
    assert np.isnan(gm.pooled_psnr(a, a, np.zeros_like(changed)))


def test_changed_psnr_reads_only_what_the_game_changed():
    prev = np.zeros((1, 4, 4, 3), np.uint8)
    truth = prev.copy()
    truth[0, 1, 1] = 200
    copy_last = prev
    assert gm.changed_psnr(copy_last, truth, prev) == pytest.approx(
        10 * np.log10(255 ** 2 / 200 ** 2))
    assert gm.changed_psnr(truth, truth, prev) == gm.PSNR_CAP


def test_effect_correlation_signs_and_no_effect():
    rng = np.random.default_rng(0)
    a, b = rng.integers(0, 255, (2, 3, 8, 8, 3)).astype(np.uint8)
    assert gm.effect_correlation(a, b, a, b) == pytest.approx(1.0)
    assert gm.effect_correlation(b, a, a, b) == pytest.approx(-1.0)
    assert np.isnan(gm.effect_correlation(a, b, a, a))


def test_off_palette_worst_window_and_change_rate():
    colours = np.array([[0, 0, 0], [9, 9, 9]], np.uint8)
    frames = np.zeros((300, 2, 2, 3), np.uint8)
    frames[150:160, 0, 0] = (1, 2, 3)  # 10 frames with a quarter off the palette
    assert gm.off_palette_share(frames, colours) == pytest.approx(10 * 0.25 / 100)
    assert gm.change_rate(frames) == pytest.approx(2 * 0.25 / 299)
