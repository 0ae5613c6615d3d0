"""Held-out play of a game for evaluation: episodes whose seeds no recording used, played by
the held-key policy from a random number of warm-up frames in."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from worldstream.engine.worlds.game.env import GameEnv, Snapshot
from worldstream.engine.worlds.game.policy import HeldKeyPolicy
from worldstream.engine.worlds.game.record import HELD_OUT_SEED


@dataclass
class Trajectory:
    """``frames`` ``(T, S, S, 3)`` uint8 and ``actions`` ``(T - 1,)`` (the action after each
    frame but the last), one episode, no reset inside; ``snapshots[t]`` where taken."""

    frames: np.ndarray
    actions: np.ndarray
    snapshots: dict[int, Snapshot] = field(default_factory=dict)


def held_out(game: GameEnv, index: int, length: int, *, seed: int = 0,
             snapshot_every: int = 0, hold: tuple[int, int] = (3, 30)) -> Trajectory:
    """Episode ``index`` of the held-out set: warm-up of 20-300 frames, then up to ``length``
    frames (fewer when the game ends first)."""
    rng = np.random.default_rng([seed, index, 7])
    policy = HeldKeyPolicy(game.action_meanings, rng, min_hold=hold[0], max_hold=hold[1])
    frame = game.reset(HELD_OUT_SEED + 1000 * seed + index)
    for _ in range(int(rng.integers(20, 300))):
        frame = game.step(policy())
        if game.done:
            frame = game.reset(HELD_OUT_SEED + 1000 * seed + index + 500)
            policy.reset()
    frames, actions, snaps = [frame], [], {}
    for t in range(length - 1):
        if snapshot_every and t % snapshot_every == 0:
            snaps[t] = game.snapshot()
        action = policy()
        frame = game.step(action)
        actions.append(action)
        frames.append(frame)
        if game.done:
            break
    return Trajectory(np.stack(frames), np.asarray(actions, dtype=np.int64), snaps)
