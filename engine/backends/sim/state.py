"""A simulator session's state (:class:`SimState`), apart from the backend so that the save
state builds one without importing the backend."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from worldstream.engine.worlds.simulator import WorldSimulator


@dataclass
class SimState:
    """One session's (or branch's) world: the simulator and the snapshots taken before each
    of its newest chunks (oldest first, at most ``rewind_chunks``)."""

    sim: WorldSimulator
    history: deque[WorldSimulator] = field(default_factory=deque)
    freed: bool = False

    @property
    def scene(self) -> str:
        return self.sim.scene
