"""Crafter (pure Python, top-down) as a Gymnasium env whose episodes are a pure function of
their seed and actions."""

from __future__ import annotations

import collections
import functools
from typing import Any

from worldstream.engine.worlds.game.env import GameEnvError, OldApiEnv


def make_crafter(reward: bool = True, size: int = 64) -> OldApiEnv:
    """Crafter (pure Python, top-down) through Gymnasium's API."""
    try:
        import crafter
    except ImportError as exc:
        raise GameEnvError("crafter is not installed: pip install crafter") from exc
    env = crafter.Env(area=(64, 64), size=(size, size), reward=reward)
    env._world.__class__ = _ordered_world(type(env._world))
    return OldApiEnv(env, list(crafter.constants.actions))


class _InsertionOrderedSet(dict):
    """The part of ``set`` crafter's world uses, iterated in insertion order."""

    def add(self, item: Any) -> None:
        self[item] = None

    def remove(self, item: Any) -> None:
        del self[item]


@functools.cache
def _ordered_world(world_class: type) -> type:
    """crafter's ``World`` with its chunks' objects in insertion order. crafter keeps them in
    sets, whose order follows the objects' memory addresses, and despawns the creature at a
    random index of that order: the same seed and actions then diverged (frame 148 of a
    600-step episode) in an env that had played an episode before."""

    class OrderedChunksWorld(world_class):
        def reset(self, seed: int | None = None) -> None:
            super().reset(seed)
            self._chunks = collections.defaultdict(_InsertionOrderedSet)

    # found by name (this module's __getattr__): a snapshot's copy of the env pickles, e.g.
    # from the process that replays a save point (engine.backends.game.savestate_sim)
    OrderedChunksWorld.__qualname__ = "OrderedChunksWorld"
    OrderedChunksWorld.__module__ = __name__
    return OrderedChunksWorld


def __getattr__(name: str) -> Any:
    if name == "OrderedChunksWorld":
        import crafter

        return _ordered_world(crafter.engine.World)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
