"""Evaluation metrics validated on the simulator's ground truth before they judge a model."""

import numpy as np
import pytest

from worldstream.engine.evaluation.drift import (
    drift_metrics,
    fragmentation_metrics,
    frame_stats,
    scene_palette,
    segment_means,
)
from worldstream.engine.evaluation.episodes import record
from worldstream.engine.evaluation.metrics import (
    OFF_PALETTE_LEVELS,
    SceneClassifier,
    ScenePalette,
    anisotropy,
    boundary_density,
    image_shift,
    mean_luma,
    motion_class,
    psnr,
    sharpness,
    terrain_classes,
)
from worldstream.engine.evaluation.run import (
    DOWN,
    IDLE,
    LEFT,
    RIGHT,
    UP,
    action_hits,
    revisit_actions,
    travel_actions,
)
from worldstream.engine.worlds import scenes
from worldstream.engine.worlds.actions import direction_to_action
from worldstream.engine.worlds.scenes import SCENE_NAMES
from worldstream.engine.worlds.simulator import WorldSimulator, player_mask


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


@pytest.mark.parametrize("seed,chunk", [(7, 2), (8, 2), (9, 2), (7, 1), (8, 1)])
def test_action_metric_scores_ground_truth_near_one(seed, chunk):
    ep = record(seed, 64)
    hits = action_hits(ep.frames, ep.offsets, chunk)
    assert np.mean(hits) >= 0.93


def test_action_metric_accepts_the_simulator_at_another_subpixel_phase():
    """The same world and play with the camera started at another fraction of a pixel: the
    crops' integer steps fall on other frames, which the strict reading (integer offsets)
    counts as misses and the continuous path does not."""
    strict, aware = [], []
    for seed in (900_100, 900_101, 900_105):
        ep = record(seed, 41)
        twin = record(seed, 41, subpixel=(0.5, 0.5))
        assert np.abs(twin.positions - ep.positions).max() < 1.0  # the same path, shifted
        strict += action_hits(twin.frames, ep.offsets, 1)
        aware += action_hits(twin.frames, ep.positions, 1)
    assert np.mean(aware) == 1.0
    assert np.mean(strict) < 0.95  # measured 0.89-0.94 on 12 episodes


def test_action_metric_on_positions_fails_a_frozen_video_wherever_the_camera_moves_a_pixel():
    ep = record(11, 64)
    frozen = np.repeat(ep.frames[:1], len(ep.frames), axis=0)
    step = np.abs(np.diff(ep.positions, axis=0))  # (63, 2) px per frame
    # hand-worked: a still picture matches a pixel step of 0 only, possible iff |d| < 1
    expected = [bool((s < 1.0).all()) for s in step]
    assert action_hits(frozen, ep.positions, 1) == expected
    assert 0 < np.mean(expected) < 0.5  # the episode moves, and also rests


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


def test_anisotropy_separates_terrain_from_stripes():
    frames = record(21, 40, "snow").frames
    assert max(anisotropy(f) for f in frames) < 0.15
    img = frames[10]
    stripes = np.repeat(img[:, 40:41], 128, axis=1)  # one column smeared across: streaks
    assert anisotropy(stripes) > 0.95
    assert anisotropy(np.ascontiguousarray(stripes.transpose(1, 0, 2))) > 0.95


def test_scene_palette_hand_worked():
    """Two colours on a 64 x 64 frame: a pixel within OFF_PALETTE_LEVELS of either is on the
    palette, one beyond it off; the sprite's box never counts."""
    frame = np.zeros((1, 64, 64, 3), np.uint8)
    frame[0, :, 32:] = (200, 100, 50)
    palette = ScenePalette(frame)
    assert palette.colours.tolist() == [[0, 0, 0], [200, 100, 50]]
    keep = ~player_mask(64)
    test = np.zeros((64, 64, 3), np.uint8)
    test[:4, :4] = (12, 16, 0)  # 20 levels from black: on
    test[-4:, -4:] = (212, 100, 67)  # sqrt(144 + 289) = 20.8 levels from the colour: off
    assert palette.off_fraction(test) == pytest.approx(16 / keep.sum())
    test[player_mask(64)] = (255, 0, 255)  # the sprite's box is not read
    assert palette.off_fraction(test) == pytest.approx(16 / keep.sum())
    assert palette.off_fraction(test, levels=21) == 0.0
    with pytest.raises(ValueError, match="frames"):
        ScenePalette(frame[0])


@pytest.mark.slow
@pytest.mark.parametrize("scene", SCENE_NAMES)
def test_scene_palette_holds_other_worlds_and_refuses_a_foreign_colour(scene):
    """Every frame of another world of the scene is on its palette (the evaluation's worlds
    are not among those the palette was read from); a magenta patch of 32 x 32 px, a colour
    no scene draws, is off it, exactly its area."""
    palette = scene_palette(scene)
    frames = record(900_301, 200, scene).frames[::10]
    assert max(palette.off_fraction(f) for f in frames) <= 0.001
    assert OFF_PALETTE_LEVELS == 20.0
    painted = frames[5].copy()
    painted[:32, :32] = (255, 0, 255)
    area = 32 * 32 / (~player_mask(128)).sum()
    assert palette.off_fraction(painted) == pytest.approx(area, abs=0.001)


def test_terrain_classes_hand_worked():
    """A pixel takes the class whose colour, scaled within CLASS_SCALE, lies nearest: a
    shadowed green (0.6 x) is still green, a colour darker than half of every class is read
    at half brightness, a grey between green and blue goes to the nearer one."""
    palette = np.array([(0, 0, 200), (0, 200, 0)])
    rgb = np.array([[(0, 120, 0), (0, 0, 230), (0, 40, 10), (0, 90, 110)]], np.uint8)
    # (0, 40, 10): 0.5 green (0, 100, 0) errs 60^2 + 10^2 = 3700, 0.5 blue 40^2 + 90^2 = 9700;
    # (0, 90, 110): 0.55 blue (0, 0, 110) errs 90^2 = 8100, 0.5 green 10^2 + 110^2 = 12200
    assert terrain_classes(rgb, palette).tolist() == [[1, 0, 1, 0]]


def test_boundary_density_hand_worked():
    """Two classes split down the middle of a 64 x 64 frame: one changing pair in each of
    the rows that do not cross the sprite's box, with or without the majority filter (a
    straight edge keeps its place); a checkerboard changes at every pair unfiltered, and a
    lone pixel of another class counts only unfiltered."""
    palette = np.array([(0, 0, 200), (0, 200, 0)])
    frame = np.zeros((64, 64, 3), np.uint8)
    frame[..., 2] = 200
    frame[:, 32:] = (0, 200, 0)
    keep = ~player_mask(64)
    pairs = (keep[:, 1:] & keep[:, :-1]).sum() + (keep[1:] & keep[:-1]).sum()
    rows = int(np.sum(keep[:, 31] & keep[:, 32]))
    assert boundary_density(frame, palette) == pytest.approx(rows / pairs)
    assert boundary_density(frame, palette, majority=1) == pytest.approx(rows / pairs)
    checker = np.where((np.add.outer(np.arange(64), np.arange(64)) % 2)[..., None] == 1,
                       np.array([0, 200, 0], np.uint8), np.array([0, 0, 200], np.uint8))
    assert boundary_density(checker, palette, majority=1) == 1.0
    frame[10, 10] = (0, 200, 0)  # a green pixel in the blue half: 4 more changing pairs
    assert boundary_density(frame, palette, majority=1) == pytest.approx((rows + 4) / pairs)
    assert boundary_density(frame, palette) == pytest.approx(rows / pairs)


@pytest.mark.parametrize("scene", SCENE_NAMES)
def test_terrain_classes_read_the_simulators_class_map(scene):
    """On the simulator's own frames (moving, a held-out world) the classifier gives the true
    terrain class to >= 99 % of the pixels outside the sprite; a mottle of the scene's own
    classes 4 px across reads over twice the real frame's boundary density."""
    sim = WorldSimulator(900_777, scene)
    down_right = direction_to_action(1, 1)
    keep = ~player_mask(128)
    palette = scenes.palette(scene)
    for _ in range(40):
        frame = sim.step(down_right)
        x0, y0 = sim.crop_origin()
        truth = sim._crop(lambda i, j: sim._tile(i, j).classes, x0, y0)
        assert np.mean((terrain_classes(frame, palette) == truth)[keep]) >= 0.99
    rng = np.random.default_rng(0)
    blocks = rng.integers(0, len(palette), (32, 32)).repeat(4, 0).repeat(4, 1)
    mottle = (np.asarray(palette)[blocks]).astype(np.uint8)
    assert boundary_density(mottle, palette) > 2 * boundary_density(frame, palette)


def test_fragmentation_segments_hand_worked():
    """The worst 40-frame segment's ratio of the model's boundary density to the simulator's,
    the whole runs' ratio, the other worlds' worst segment (the twin) and the autoencoder's."""
    sim = np.full(80, 0.1)
    sim[40:] = 0.05
    run = {"fragmentation": np.concatenate([np.full(40, 0.2), np.full(40, 0.15)]),
           "fragmentation_sim": sim,
           "fragmentation_other_worlds": np.array([np.full(80, 0.06), np.full(80, 0.11)]),
           "fragmentation_autoencoder": np.array([0.11] * 4 + [0.055] * 4)}
    out = fragmentation_metrics([run])
    assert out["rollout_fragmentation"] == 3.0  # 0.15 / 0.05
    assert out["rollout_fragmentation_mean"] == pytest.approx(round(0.175 / 0.075, 3))
    assert out["rollout_fragmentation_ground_truth"] == 2.2  # 0.11 / 0.05
    # frames 0, 10, ..., 70 of the simulator: 0.1 x 4 and 0.05 x 4
    assert out["rollout_fragmentation_autoencoder"] == pytest.approx(
        round((0.44 + 0.22) / 8 / 0.075, 3))


def test_mean_luma_hand_worked():
    img = np.zeros((8, 8, 3), np.uint8)
    img[..., 1] = 100  # green only: luma 0.587 * 100
    assert mean_luma(img) == pytest.approx(58.7)


def test_drift_metrics_of_the_ground_truth_against_itself():
    runs = {"length": 240, "runs": []}
    for moving in (False, True):
        ep = record(31 + moving, 240, "meadow", actions=None if moving else [4] * 240)
        stats = np.array([frame_stats(f) for f in ep.frames])
        runs["runs"].append({"scene": "meadow", "moving": moving, "model": stats, "sim": stats})
    out = drift_metrics(runs)
    assert out["rollout_sharpness_ratio"] == out["rollout_sharpness_ratio_max"] == 1.0
    assert out["rollout_luma_drift_max_abs"] == 0.0
    assert out["rollout_anisotropy"] == out["rollout_anisotropy_ground_truth"] < 0.15
    assert out["drift_ratio_240"]["vs_sim"] == {"sharpness": 1.0, "colour": 1.0}
    assert out["luma_drift_max_abs"] == 0.0
    assert "luma_drift_ground_truth" not in out  # no other worlds recorded
    # a rollout that darkens by 20 levels reads as -20 luma drift
    runs["runs"][0]["model"] = runs["runs"][0]["model"] - [0, 0, 20, 0, 0, 0]
    assert drift_metrics(runs)["luma_drift"]["meadow_idle"] == -20.0


def test_luma_drifts_twin_is_the_rms_over_other_worlds_hand_worked():
    stats = np.zeros((240, 6))
    stats[:, 2] = 100.0
    stats[-100:, 2] = 110.0  # this world's frames 140-240: luma 110
    runs = {"length": 240, "runs": [
        {"scene": "snow", "moving": False, "model": stats, "sim": stats,
         "other_worlds_luma": [113.0, 106.0]},  # +3, -4: RMS sqrt(12.5)
        {"scene": "snow", "moving": True, "model": stats, "sim": stats,
         "other_worlds_luma": [110.0]}]}
    out = drift_metrics(runs)
    assert out["luma_drift_ground_truth"] == {"snow_idle": round(np.sqrt(12.5), 2),
                                              "snow_moving": 0.0}
    assert out["luma_drift_ground_truth_max"] == round(np.sqrt(12.5), 2)


def test_off_palette_segments_hand_worked():
    """The worst 40-frame segment's mean fraction off the palette, its mean over the frames,
    the simulator's and the autoencoder's twins, over the moving runs."""
    stats = np.array([frame_stats(f) for f in record(35, 80, "desert").frames])
    a = np.zeros(80)
    a[40:] = 0.5  # segments 0.0 and 0.5
    b = np.full(80, 0.1)
    b[:20] = 0.9  # segments 0.5 and 0.1
    run = {"scene": "desert", "moving": True, "model": stats, "sim": stats}
    runs = {"length": 80, "runs": [
        {**run, "off_palette": a, "off_palette_sim": np.zeros(80),
         "off_palette_autoencoder": np.array([0.02, 0.04])},
        {**run, "off_palette": b, "off_palette_sim": np.full(80, 0.001),
         "off_palette_autoencoder": np.array([0.01])}]}
    assert segment_means(b) == pytest.approx([0.5, 0.1])
    out = drift_metrics(runs)
    assert out["rollout_off_palette"] == 0.5
    assert out["rollout_off_palette_mean"] == pytest.approx((0.25 + 0.3) / 2)
    assert out["rollout_off_palette_ground_truth"] == 0.001
    assert out["rollout_off_palette_autoencoder"] == 0.03
    del runs["runs"][0]["off_palette"]  # runs recorded without it: no such metric
    assert "rollout_off_palette" not in drift_metrics(runs)


def test_rollout_segments_see_an_early_change_of_scene_that_the_end_does_not():
    """A moving rollout whose frames 80-119 are 30 levels brighter and twice as sharp (a dark
    world turned into a bright one for one segment, then back): the segments' max sharpness
    ratio and luma read it; the end of the rollout (luma_drift) and the min do not."""
    ep = record(33, 240, "night")
    stats = np.array([frame_stats(f) for f in ep.frames])
    model = stats.copy()
    model[80:120, 0] *= 2.0
    model[80:120, 2] += 30.0
    runs = {"length": 240, "runs": [{"scene": "night", "moving": True, "model": model,
                                     "sim": stats}]}
    out = drift_metrics(runs)
    assert out["rollout_sharpness_ratio_max"] == 2.0 and out["rollout_sharpness_ratio"] == 1.0
    assert out["rollout_luma_drift_max_abs"] == 30.0
    assert out["luma_drift_max_abs"] == 0.0


@pytest.mark.parametrize("key,back", [(RIGHT, LEFT), (DOWN, UP), (LEFT, RIGHT), (UP, DOWN)])
def test_revisit_script_returns_the_simulators_camera(key, back):
    acts = revisit_actions(key, back)
    ep = record(41, len(acts), actions=acts)
    assert np.array_equal(ep.offsets[3], ep.offsets[-1])
    assert np.abs(ep.offsets - ep.offsets[3]).max() > 80  # it went far enough to leave the view


@pytest.mark.parametrize("key,across", [(RIGHT, DOWN), (UP, LEFT)])
def test_travel_before_a_revisit_leaves_the_start_view(key, across):
    """The loop of ``revisit(travel=True)`` starts where nothing of the start view shows."""
    acts = [IDLE] * 4 + travel_actions(across)
    ep = record(41, len(acts), actions=acts)
    assert np.abs(ep.offsets[-1] - ep.offsets[3]).max() > 128
    assert np.array_equal(ep.offsets[-1], ep.offsets[-2])  # at rest when the loop starts
