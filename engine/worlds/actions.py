"""Action ids of the built-in world: 9 directions (8 + idle) from held direction keys.

``action_id = (dy + 1) * 3 + (dx + 1)`` with ``dx = right - left`` and ``dy = down - up``
(image coordinates: +y is down), so idle is 4. Opposite keys held together cancel.
"""

from __future__ import annotations

from collections.abc import Iterable

from worldstream.engine.core.limits import check_keys

NUM_ACTIONS = 9
IDLE = 4


def keys_to_action(keys: Iterable[str]) -> int:
    """Action id for a set of held keys; raises ValueError naming an unknown key."""
    held = check_keys(keys)
    dx = ("right" in held) - ("left" in held)
    dy = ("down" in held) - ("up" in held)
    return direction_to_action(dx, dy)


def direction_to_action(dx: int, dy: int) -> int:
    if dx not in (-1, 0, 1) or dy not in (-1, 0, 1):
        raise ValueError(f"direction components must be -1, 0 or 1, got ({dx}, {dy})")
    return (dy + 1) * 3 + (dx + 1)


def action_to_direction(action: int) -> tuple[int, int]:
    """``(dx, dy)`` of an action id; raises ValueError outside ``[0, NUM_ACTIONS)``."""
    if not 0 <= action < NUM_ACTIONS:
        raise ValueError(f"action id must be in [0, {NUM_ACTIONS}), got {action}")
    return action % 3 - 1, action // 3 - 1
