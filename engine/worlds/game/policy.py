"""A human-like player for recording: keys held for a while, pauses, the start action.

People hold a key for a few hundred milliseconds, let go, and press the game's start button
(FIRE) when a round begins; uniform random actions every frame look nothing like that and
leave a world model no held-key motion to learn.
"""

from __future__ import annotations

import numpy as np

#: meanings that start a round (pressed at the start of an episode)
START_WORDS = ("FIRE", "ATTACK", "DO", "USE")


class HeldKeyPolicy:
    """Actions held for ``hold`` frames (uniform in ``[min_hold, max_hold]``), a pause (the
    idle action, id 0) with probability ``pause``, the start action for the first
    ``start_frames`` frames of an episode when the game has one.

    Args:
        meanings: the env's action meanings (index = action id).
        rng: the player's generator (the recording's seed makes it repeatable).
    """

    def __init__(self, meanings: tuple[str, ...], rng: np.random.Generator, *,
                 min_hold: int = 3, max_hold: int = 30, pause: float = 0.15,
                 start_frames: int = 4):
        self.n = len(meanings)
        self.rng = rng
        self.min_hold, self.max_hold, self.pause = min_hold, max_hold, pause
        upper = [m.upper() for m in meanings]
        self.start = next((upper.index(w) for w in START_WORDS if w in upper), None)
        self.start_frames = start_frames
        self._action, self._left, self._t = 0, 0, 0

    def reset(self) -> None:
        """A new episode: the start action comes first again."""
        self._action, self._left, self._t = 0, 0, 0

    def __call__(self) -> int:
        """The next frame's action id."""
        self._t += 1
        if self.start is not None and self._t <= self.start_frames:
            return self.start
        if self._left <= 0:
            self._left = int(self.rng.integers(self.min_hold, self.max_hold + 1))
            idle = self.rng.random() < self.pause
            self._action = 0 if idle else int(self.rng.integers(0, self.n))
        self._left -= 1
        return self._action
