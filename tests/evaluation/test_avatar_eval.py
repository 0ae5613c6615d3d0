"""The avatar evaluation's metrics on hand-worked signals (the probe and the model are not
needed: their reads are given)."""

from __future__ import annotations

import numpy as np
import pytest

from worldstream.engine.evaluation import avatar as A
from worldstream.engine.evaluation.avatar_drift import LATE, REGIONS, identity_ratio
from worldstream.engine.evaluation.avatar_episodes import (
    EXPRESSION_HOLD,
    TURN_HOLD,
    TURN_WINDOW,
    scripted_actions,
    scripted_episode,
    teacher_forced_turns,
)
from worldstream.engine.evaluation.avatar_readers import TurnTemplates
from worldstream.engine.worlds.actions import IDLE, direction_to_action
from worldstream.engine.worlds.avatar.actions import decode_action


def test_lipsync_finds_the_lag_of_a_delayed_mouth():
    rng = np.random.default_rng(0)
    track = rng.random(200)
    late = np.concatenate([np.zeros(2), track[:-2]])  # the mouth follows 2 frames late
    corr, lag = A.lipsync(late, track)
    assert lag == 2 and corr == pytest.approx(1.0, abs=1e-9)
    corr, lag = A.lipsync(-track, track)  # anti-correlated: the best lag is not perfect
    assert corr < 0.3


def test_expression_and_turn_hits_count_the_windows_by_hand():
    n = 100
    read = {"expression": np.zeros(n, int), "direction": np.full(n, IDLE)}
    read["expression"][40:] = 2  # the face changes 15 frames after the key at 25
    # key at 25 (expression 2): window frames 35..54, of which 40..54 hit = 15 of 20
    hits = A.expression_hits(read, [(25, 2)])
    assert len(hits) == 20 and sum(hits) == 15
    right_up = direction_to_action(1, -1)
    read["direction"][60:] = right_up
    read["direction"][62] = TurnTemplates.UNREADABLE  # a frame nobody can read: a miss
    # key at 48 (right-up): window 58..63, hits from 60 but 62 = 3 of 6; key at 0: all 6
    hits = A.turn_hits(read, [(48, right_up), (0, IDLE)])
    assert hits == [False, False, True, True, False, True] + [True] * 6


@pytest.mark.slow
def test_turn_templates_read_the_simulators_heads_and_refuse_broken_ones():
    from worldstream.engine.worlds.avatar.actions import NEUTRAL, encode_action
    from worldstream.engine.worlds.avatar.simulator import AvatarSimulator

    seed, look = 900_650, "beach"
    turns = TurnTemplates(seed, look)
    heads = {}
    for d in (direction_to_action(-1, 0), direction_to_action(1, 1), IDLE):
        sim = AvatarSimulator(seed, look)
        # from another direction, as in the scripted episode, then 10-15 frames held
        for _ in range(20):
            sim.step(encode_action(direction_to_action(0, -1), NEUTRAL))
        heads[d] = np.stack([sim.step(encode_action(d, NEUTRAL)) for _ in range(16)])[10:]
        assert (turns.read(heads[d]) == d).all()
    left, right_down = heads[direction_to_action(-1, 0)], heads[direction_to_action(1, 1)]
    # two heads ghosted into one, or a head cut into shuffled 16-px blocks: no direction
    ghost = ((left.astype(np.float32) + right_down) / 2).astype(np.uint8)
    blocks = left.copy()
    rows = [slice(r, r + 16) for r in range(16, 96, 16)]
    perm = np.random.default_rng(0).permutation(len(rows))
    for r, src in zip(rows, perm):
        blocks[:, r] = left[:, rows[src]]
    assert (turns.read(ghost) == TurnTemplates.UNREADABLE).all()
    assert (turns.read(blocks) == TurnTemplates.UNREADABLE).all()


@pytest.mark.slow
def test_the_strict_turn_reading_passes_the_simulator_and_refuses_a_head_at_rest_ghosted_over():
    """The simulator's turn-window frames of three held-out looks pass the strict reading; the
    same frames with half of the head at rest blended over them (the model's ghost) never do,
    though some pass the metric's full gate."""
    full_ok = strict_ok = 0
    for i, look in enumerate(("office", "beach", "forest")):
        seed = 900_600 + i
        sep = scripted_episode(seed, look)
        frames, turns = sep.episode.frames, TurnTemplates(seed, look)
        rest = frames[sep.turn_keys[0][0] - 1].astype(np.float32)
        for f, d in sep.turn_keys:
            window = frames[f + 10 : f + 16]
            assert (turns.read(window, A.STRICT_TURN_SHARE) == d).all()
            if d == IDLE:
                continue
            ghost = ((window.astype(np.float32) + rest) / 2).round().astype(np.uint8)
            full_ok += int((turns.read(ghost) == d).sum())
            strict_ok += int((turns.read(ghost, A.STRICT_TURN_SHARE) == d).sum())
    assert strict_ok == 0 and full_ok > 0


def test_identity_ratio_picks_the_feature_farthest_from_one():
    feats = np.ones((1500, 2 + 3 * len(REGIONS))) * 100.0
    feats[LATE, 5] = 80.0  # one colour down 20 %
    feats[LATE, 7] = 110.0  # another up 10 %
    assert identity_ratio(feats) == pytest.approx(0.8)


def test_scripted_segments_hold_what_they_say():
    rng = np.random.default_rng(1)
    actions, expression_keys, turn_keys, speech = scripted_actions(rng)
    assert sorted(e for _, e in expression_keys) == [0, 1, 2, 3, 4]
    assert sorted(d for _, d in turn_keys) == list(range(9))
    for f, e in expression_keys:
        held = {decode_action(a) for a in actions[f : f + EXPRESSION_HOLD]}
        assert held == {(IDLE, e, 0)}
    for f, d in turn_keys:
        assert {decode_action(a) for a in actions[f : f + TURN_HOLD]} == {(d, 0, 0)}
    spoken = [decode_action(a) for a in actions[speech.start : speech.stop]]
    assert {(d, e) for d, e, _ in spoken} == {(IDLE, 0)}
    assert len({v for _, _, v in spoken}) > 3 and speech.stop == len(actions)
    track = A.track_openness(actions)
    assert track[: speech.start].max() == 0 and track[speech].max() == 1.0


@pytest.mark.slow
def test_teacher_forced_turns_generate_each_window_frame_from_the_true_frames_before_it(
        monkeypatch):
    """A generator that shows the simulator's own frame for the position it is asked (the
    stream's position is how many frames it has observed): the teacher-forced frames are the
    simulator's, frame for frame, and read as the ground truth does (1.0); every window frame
    is generated once from a fork whose context holds exactly the frames before it."""
    from tests.fixtures.builtin import tiny_avatar_backend
    from worldstream.engine.core.backend import ChunkResult

    gen = tiny_avatar_backend().builtin
    sep = scripted_episode(900_601, "beach")
    asked = []

    def true_frame(jobs):
        (job,) = jobs
        asked.append(job.state.position)
        return [ChunkResult(sep.episode.frames[job.state.position][None])]

    monkeypatch.setattr(gen, "generate", true_frame)
    out = teacher_forced_turns(gen, sep, 2, 900_601)
    a, b = TURN_WINDOW
    want = sorted(f + k for f, _ in sep.turn_keys for k in range(a, b))
    assert asked == want and len(out) == want[-1] + 1
    np.testing.assert_array_equal(out, sep.episode.frames[: len(out)])
    read = TurnTemplates(900_601, "beach").read(out)
    assert all(A.turn_hits({"direction": read}, sep.turn_keys))


def test_ghost_share_reads_how_much_of_the_head_at_rest_is_blended_over_the_turned_heads():
    """Hand-worked: the simulator's frames read 0; the same frames with a share ``a`` of the
    picture at rest blended over them read ``a`` (to rounding); an error unrelated to the head
    at rest (a constant tint) reads near 0; pooled sums weigh episodes by their turns."""
    sep = scripted_episode(900_601, "beach")
    frames, rest = sep.episode.frames, sep.episode.frames[0]
    num, den = A.ghost_sums(frames, frames, rest, sep.turn_keys)
    assert num == 0 and den > 0
    for a in (0.25, 0.5):
        blend = (1 - a) * frames.astype(np.float64) + a * rest.astype(np.float64)
        num, den = A.ghost_sums(blend.round().astype(np.uint8), frames, rest, sep.turn_keys)
        assert abs(num / den - a) < 0.01
    tinted = np.clip(frames.astype(np.int16) + 12, 0, 255).astype(np.uint8)
    num, den = A.ghost_sums(tinted, frames, rest, sep.turn_keys)
    assert abs(num / den) < 0.05
