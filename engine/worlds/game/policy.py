"""Human-like players for recording and evaluation: taps, holds, pauses, the start action.

People tap keys (0.2-0.6 s presses), hold them for a while, let go, and press the game's start
button (FIRE) when a round begins and after each ball they lose; uniform random actions every
frame look nothing like that and leave a world model no key motion to learn. Frame counts
here are a game's frames (15 a second for an Atari game at frame skip 4).
"""

from __future__ import annotations

from dataclasses import dataclass

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


@dataclass(frozen=True)
class PlayStyle:
    """How a :class:`Player` plays, in frames. ``mix``: the odds of a tap, a hold and a pause
    as the next move; ``tap``, ``gap``: a tap's press and the release after it; ``hold``,
    ``rest``: a hold's and a pause's length; ``fire_every``: the start action pressed again
    every so many frames ((0, 0): never by chance); ``react``: frames from a lost ball to the
    start action; ``press``: frames the start action is held."""

    mix: tuple[float, float, float] = (0.45, 0.35, 0.2)
    tap: tuple[int, int] = (3, 9)
    gap: tuple[int, int] = (2, 10)
    hold: tuple[int, int] = (10, 45)
    rest: tuple[int, int] = (5, 30)
    fire_every: tuple[int, int] = (45, 150)
    react: tuple[int, int] = (4, 20)
    press: int = 3


#: the recording's player: taps, holds and pauses, FIRE at each start and after each lost ball
RECORDING = PlayStyle()
#: a player who only taps (0.2-0.6 s at 15 fps, with gaps) and presses FIRE every 2-5 s
TAPS = PlayStyle(mix=(1.0, 0.0, 0.0), tap=(3, 9), gap=(3, 12), fire_every=(30, 75))


class Player:
    """A person at the keys: moves drawn from ``style`` (:class:`PlayStyle`), the start action
    for the first ``style.press`` frames of an episode, again ``style.react`` frames after
    each lost ball (``setback()``) and by chance every ``style.fire_every`` frames.

    Args:
        meanings: the env's action meanings (index = action id; 0 is idle).
        rng: the player's generator (a seed makes it repeatable).
    """

    def __init__(self, meanings: tuple[str, ...], rng: np.random.Generator,
                 style: PlayStyle = RECORDING):
        self.n = len(meanings)
        self.rng, self.style = rng, style
        upper = [m.upper() for m in meanings]
        self.start = next((upper.index(w) for w in START_WORDS if w in upper), None)
        self.keys = [a for a in range(1, self.n) if a != self.start] or [0]
        self._plan: list[int] = []
        self._fire_at = -1
        self._t = 0
        self.reset()

    def _span(self, bounds: tuple[int, int]) -> int:
        return int(self.rng.integers(bounds[0], bounds[1] + 1))

    def reset(self) -> None:
        """A new episode: the start action comes first again."""
        self._t = 0
        self._plan = []
        self._fire_at = 0 if self.start is not None else -1
        self._next_fire()

    def _next_fire(self) -> None:
        lo, hi = self.style.fire_every
        self._chance_at = self._t + self._span((lo, hi)) if hi > 0 else -1

    def setback(self) -> None:
        """The player lost a ball: the start action after a reaction time."""
        if self.start is not None:
            self._fire_at = self._t + self._span(self.style.react)

    def _move(self) -> list[int]:
        s = self.style
        kind = self.rng.choice(3, p=np.asarray(s.mix) / sum(s.mix))
        key = self.keys[int(self.rng.integers(0, len(self.keys)))]
        if kind == 0:
            return [key] * self._span(s.tap) + [0] * self._span(s.gap)
        if kind == 1:
            return [key] * self._span(s.hold)
        return [0] * self._span(s.rest)

    def __call__(self) -> int:
        """The next frame's action id."""
        t = self._t
        self._t += 1
        if self.start is not None and 0 <= self._chance_at <= t and self._fire_at < 0:
            self._fire_at = t
            self._next_fire()
        if self.start is not None and 0 <= self._fire_at <= t:
            if t >= self._fire_at + self.style.press - 1:
                self._fire_at = -1
            return self.start
        if not self._plan:
            self._plan = self._move()
        return self._plan.pop(0)
