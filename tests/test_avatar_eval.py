"""The avatar evaluation's metrics on hand-worked signals (the probe and the model are not
needed: their reads are given)."""

from __future__ import annotations

import numpy as np
import pytest

from worldstream.engine.evaluation import avatar as A
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
    read = {"expression": np.zeros(n, int), "yaw": np.ones(n, int), "pitch": np.ones(n, int)}
    read["expression"][40:] = 2  # the face changes 15 frames after the key at 25
    # key at 25 (expression 2): window frames 35..54, of which 40..54 hit = 15 of 20
    hits = A.expression_hits(read, [(25, 2)])
    assert len(hits) == 20 and sum(hits) == 15
    right_up = direction_to_action(1, -1)
    read["yaw"][60:] = 2
    read["pitch"][60:] = 0
    # key at 48 (right-up): window 58..63, hits from 60 = 4 of 6; key at 0 (idle): all 6
    hits = A.turn_hits(read, [(48, right_up), (0, IDLE)])
    assert hits == [False, False, True, True, True, True] + [True] * 6


def test_identity_ratio_picks_the_feature_farthest_from_one():
    feats = np.ones((1500, 2 + 3 * len(A.REGIONS))) * 100.0
    feats[A.LATE, 5] = 80.0  # one colour down 20 %
    feats[A.LATE, 7] = 110.0  # another up 10 %
    assert A.identity_ratio(feats) == pytest.approx(0.8)


def test_scripted_segments_hold_what_they_say():
    rng = np.random.default_rng(1)
    actions, expression_keys, turn_keys, speech = A.scripted_actions(rng)
    assert sorted(e for _, e in expression_keys) == [0, 1, 2, 3, 4]
    assert sorted(d for _, d in turn_keys) == list(range(9))
    for f, e in expression_keys:
        held = {decode_action(a) for a in actions[f : f + A.EXPRESSION_HOLD]}
        assert held == {(IDLE, e, 0)}
    for f, d in turn_keys:
        assert {decode_action(a) for a in actions[f : f + A.TURN_HOLD]} == {(d, 0, 0)}
    spoken = [decode_action(a) for a in actions[speech.start : speech.stop]]
    assert {(d, e) for d, e, _ in spoken} == {(IDLE, 0)}
    assert len({v for _, _, v in spoken}) > 3 and speech.stop == len(actions)
    track = A.track_openness(actions)
    assert track[: speech.start].max() == 0 and track[speech].max() == 1.0
