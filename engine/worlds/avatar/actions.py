"""Actions of the avatar world: one id per frame factored as (head direction, expression,
viseme).

``action_id = direction + NUM_DIRECTIONS * (expression + NUM_EXPRESSIONS * viseme)``, where
``direction`` is the landscape's 9-way id of the held arrow keys (``engine.worlds.actions``:
the head turns toward it while held and comes back when released), ``expression`` the index of
the expression set by the number keys (held until the next one) and ``viseme`` the mouth shape
the speech track asks for at that frame (``visemes.REST`` when silent). The world model embeds
the three factors separately (``WorldDiT(action_factors=ACTION_FACTORS)``).

:class:`AvatarControls` is a session's control state: the current expression and the queue of
speech frames still to say; it turns the engine's per-frame direction ids into avatar actions.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from worldstream.engine.worlds.actions import IDLE, action_to_direction
from worldstream.engine.worlds.actions import NUM_ACTIONS as NUM_DIRECTIONS
from worldstream.engine.worlds.avatar.visemes import NUM_VISEMES, REST, text_to_visemes

#: expression names in id order; number key ``k`` (1-based) sets ``EXPRESSIONS[k - 1]``
EXPRESSIONS: tuple[str, ...] = ("neutral", "smile", "surprise", "frown", "sleepy")
NUM_EXPRESSIONS = len(EXPRESSIONS)
NEUTRAL = 0
ACTION_FACTORS: tuple[int, int, int] = (NUM_DIRECTIONS, NUM_EXPRESSIONS, NUM_VISEMES)
NUM_ACTIONS = NUM_DIRECTIONS * NUM_EXPRESSIONS * NUM_VISEMES
#: the frame rate speech is timed at (the frame rate the avatar is streamed and trained at)
SPEECH_FPS = 20.0


def encode_action(direction: int = IDLE, expression: int = NEUTRAL, viseme: int = REST) -> int:
    """The avatar action id of one frame; ValueError naming a factor out of range."""
    for name, value, n in (("direction", direction, NUM_DIRECTIONS),
                           ("expression", expression, NUM_EXPRESSIONS),
                           ("viseme", viseme, NUM_VISEMES)):
        if not isinstance(value, int) or not 0 <= value < n:
            raise ValueError(f"{name} must be an int in [0, {n}), got {value!r}")
    return direction + NUM_DIRECTIONS * (expression + NUM_EXPRESSIONS * viseme)


def decode_action(action: int) -> tuple[int, int, int]:
    """``(direction, expression, viseme)`` of an avatar action id; ValueError outside
    ``[0, NUM_ACTIONS)``."""
    if not isinstance(action, int) or not 0 <= action < NUM_ACTIONS:
        raise ValueError(f"avatar action id must be an int in [0, {NUM_ACTIONS}), got {action!r}")
    rest, direction = divmod(action, NUM_DIRECTIONS)
    viseme, expression = divmod(rest, NUM_EXPRESSIONS)
    return direction, expression, viseme


def expression_index(name: str) -> int:
    """Index of an expression name; ValueError listing the valid names."""
    if name not in EXPRESSIONS:
        raise ValueError(f"unknown expression {name!r}; expected one of {EXPRESSIONS}")
    return EXPRESSIONS.index(name)


@dataclass
class AvatarControls:
    """A session's avatar controls: the expression in force and the speech frames queued
    (viseme ids, oldest first). Copy with :meth:`copy` for a fork or a rewind snapshot."""

    expression: int = NEUTRAL
    speech: deque[int] = field(default_factory=deque)

    def set_expression(self, name: str) -> None:
        """Hold expression ``name`` from the next frame on; ValueError (nothing changes) for
        an unknown name."""
        self.expression = expression_index(name)

    def say(self, text: str, rate: float = 1.0) -> int:
        """Queue ``text`` to be spoken after what is queued; returns the frames it takes.
        ValueError (nothing queued) for unsayable text (``visemes.check_say``)."""
        track = text_to_visemes(text, SPEECH_FPS, rate)
        self.speech.extend(int(v) for v in track)
        return len(track)

    def next_actions(self, directions: list[int]) -> list[int]:
        """Avatar action ids for frames with the given direction ids (one speech frame is
        consumed per frame). ValueError (nothing consumed) for a bad direction id."""
        for d in directions:
            action_to_direction(d)
        out = []
        for d in directions:
            viseme = self.speech.popleft() if self.speech else REST
            out.append(encode_action(d, self.expression, viseme))
        return out

    def copy(self) -> AvatarControls:
        return AvatarControls(self.expression, deque(self.speech))
