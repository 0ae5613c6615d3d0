"""The person-like player (taps, holds, pauses, FIRE at starts and after lost balls) and the
recording it plays: repeatable per seed, many episode starts."""

from __future__ import annotations

import numpy as np

from tests.fixtures.tiny_game import TINY
from worldstream.engine.worlds.game.policy import RECORDING, TAPS, Player
from worldstream.engine.worlds.game.record import record_shard

PONG = ("NOOP", "FIRE", "RIGHT", "LEFT", "RIGHTFIRE", "LEFTFIRE")


def _runs(actions: list[int]) -> list[tuple[int, int]]:
    """``(action, length)`` of each run of equal actions."""
    out: list[tuple[int, int]] = []
    for a in actions:
        if out and out[-1][0] == a:
            out[-1] = (a, out[-1][1] + 1)
        else:
            out.append((a, 1))
    return out


def test_taps_are_short_presses_with_fire_every_few_seconds():
    player = Player(PONG, np.random.default_rng(3), TAPS)
    actions = [player() for _ in range(3000)]
    runs = _runs(actions)
    # a tap lasts 3-9 frames unless FIRE cuts it short; the first frames are the start's FIRE
    presses = [n for i, (a, n) in enumerate(runs[1:-1], 1)
               if a not in (0, 1) and runs[i + 1][0] != 1 and runs[i - 1][0] != 1]
    assert presses and min(presses) >= 3 and max(presses) <= 9
    fires = np.flatnonzero(np.asarray(actions) == 1)
    assert fires[0] == 0
    starts = fires[np.r_[True, np.diff(fires) > 1]]
    assert np.diff(starts).max() <= 75 + 3 and np.diff(starts).min() >= 30 - 3
    # every key of the game is tapped, FIRE aside
    assert set(actions) >= {2, 3, 4, 5}


def test_the_player_fires_after_a_lost_ball_and_repeats_with_its_seed():
    a, b = (Player(PONG, np.random.default_rng(5), RECORDING) for _ in range(2))
    first = [a() for _ in range(200)]
    assert first == [b() for _ in range(200)]
    assert first != [Player(PONG, np.random.default_rng(6), RECORDING)() for _ in range(200)]
    a.setback()
    after = [a() for _ in range(30)]
    at = after.index(1)
    assert 4 <= at <= 20 and after[at:at + 3] == [1, 1, 1]


def test_the_recording_repeats_with_its_seed_and_holds_many_starts(tmp_path):
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        record_shard(TINY, 16, 4, 0, 1500, 400, str(tmp_path / name), 40)
    a, b = (np.load(tmp_path / n / "shard-00000.npz") for n in ("a", "b"))
    assert all(np.array_equal(a[k], b[k]) for k in a.files)
    episodes = np.unique(a["episode"])
    # episodes cut log-uniformly in [40, 400] frames: far more starts than 1500 / 200
    assert len(episodes) >= 9
    lengths = np.bincount(np.searchsorted(episodes, a["episode"]))
    assert lengths[:-1].min() >= 40 and lengths.max() <= 401
