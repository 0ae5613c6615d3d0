"""Evaluation metrics validated on the simulator's ground truth before they judge a model."""

import numpy as np
import pytest

from engine.evaluation.metrics import SceneClassifier, image_shift, motion_class, psnr, sharpness
from engine.evaluation.run import action_hits, record
from engine.worlds.scenes import SCENE_NAMES


def test_psnr_hand_worked():
    a = np.zeros((4, 4, 3), np.uint8)
    assert psnr(a, a + 1) == pytest.approx(20 * np.log10(255), abs=1e-9)
    assert psnr(a, a) == float("inf")


def test_image_shift_recovers_a_known_translation():
    ep = record(123, 40)
    img = ep.frames[10]
    moved = np.roll(img, shift=(-3, 5), axis=(0, 1))  # content 5 px right, 3 px up
    dx, dy = image_shift(img, moved)
    assert dx == pytest.approx(5, abs=0.3) and dy == pytest.approx(-3, abs=0.3)


@pytest.mark.parametrize("seed", [7, 8, 9])
def test_action_metric_scores_ground_truth_near_one(seed):
    ep = record(seed, 64)
    hits = action_hits(ep.frames, ep.offsets, 2)
    assert np.mean(hits) >= 0.93


def test_action_metric_rejects_frozen_video():
    ep = record(11, 64)
    frozen = np.repeat(ep.frames[:1], len(ep.frames), axis=0)
    moving = [
        motion_class(*(-(ep.offsets[c * 2 + 1] - ep.offsets[c * 2 - 1]))) != (0, 0)
        for c in range(1, 32)
    ]
    # a still picture only scores on the chunks where the camera was still
    assert np.mean(action_hits(frozen, ep.offsets, 2)) == pytest.approx(
        1 - np.mean(moving), abs=0.05
    )


def test_sharpness_drops_with_blur():
    img = record(5, 4).frames[-1]
    blurred = (img[:-1, :-1].astype(int) + img[1:, :-1] + img[:-1, 1:] + img[1:, 1:]) // 4
    assert sharpness(blurred.astype(np.uint8)) < 0.7 * sharpness(img)


def test_scene_classifier_on_unseen_worlds():
    clf = SceneClassifier({s: record(500 + k, 24, s).frames for k, s in enumerate(SCENE_NAMES)})
    correct = [
        clf.predict(f) == s
        for k, s in enumerate(SCENE_NAMES)
        for f in record(600 + k, 24, s).frames[::3]
    ]
    assert np.mean(correct) >= 0.9
