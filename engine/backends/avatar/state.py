"""An avatar session's state (:class:`AvatarState`), apart from the backends so that the save
state builds one without importing them."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from worldstream.engine.worlds.avatar.actions import AvatarControls


@dataclass
class AvatarState:
    """One session's (or branch's) avatar: the wrapped backend's state (a simulator or the
    world model's state), its controls, and the controls as they were before each of its
    newest chunks (oldest first, for rewind)."""

    inner: Any
    controls: AvatarControls = field(default_factory=AvatarControls)
    history: deque[AvatarControls] = field(default_factory=deque)
    freed: bool = False
