"""The keys of a game world, shared by its backends (the game itself, ``game_env``, and its
learned model, ``game_world``): the key map, the wire keys an ``action`` message may hold, the
page's controls, held keys -> the env's action id, and what of the environment decides frames
besides the code (``frame_version``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from worldstream.engine.worlds.game import keymap as keymaps

#: packages whose versions decide a game's frames (the env's emulator or engine)
GAME_PACKAGES = ("gymnasium", "ale-py", "vizdoom", "crafter")


def load_keymap(source: Any, env_id: str, meanings: tuple[str, ...]) -> keymaps.KeyMap:
    """The key map of ``source``: None (the shipped game world's where ``env_id`` has one,
    else derived from ``meanings``), a KeyMap, a JSON-ready dict or a file path. KeyMapError
    (a ValueError) naming what does not fit the env."""
    if source is None:
        return keymaps.shipped(env_id, meanings) or keymaps.derive(env_id, meanings)
    if isinstance(source, keymaps.KeyMap):
        return keymaps.from_json(source.to_json(), meanings, env_id)
    if isinstance(source, dict):
        return keymaps.from_json(source, meanings, env_id)
    return keymaps.load(Path(source), meanings, env_id)


def package_versions(packages: tuple[str, ...] = GAME_PACKAGES) -> dict[str, str]:
    """``{package: version}`` of the installed ones among ``packages``."""
    versions = {}
    for package in packages:
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            pass
    return versions


class GameKeys:
    """The key handling of a game world's backend. A subclass sets ``env_id``, ``size``,
    ``action_meanings`` (index = action id) and ``keymap`` (a
    :class:`~engine.worlds.game.keymap.KeyMap`) before serving."""

    env_id: str
    size: int
    action_meanings: tuple[str, ...]
    num_actions: int
    keymap: keymaps.KeyMap
    #: the state if it is live, else ValueError (each backend checks its own state type)
    live: Callable[[Any], Any]

    supported_chunk_frames: tuple[int, ...]

    def check_sizes(self, **sizes: Any) -> None:
        """A backend's sizes (``max_states``, ``default_fps``, ``chunk_frames``,
        ``rewind_chunks``) as given to its constructor: ValueError naming the first that is
        not a positive int, or a chunk size the world does not generate."""
        for arg, value in sizes.items():
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{arg} must be a positive int, got {value!r}")
        if sizes.get("chunk_frames") not in self.supported_chunk_frames:
            raise ValueError(f"chunk_frames must be one of {self.supported_chunk_frames}")

    def check_actions(self, actions: Any) -> None:
        """ValueError naming the first of ``actions`` that is not an action id of the game."""
        for action in actions:
            if not isinstance(action, int | np.integer) or not 0 <= action < self.num_actions:
                raise ValueError(f"action must be an int in [0, {self.num_actions}), got "
                                 f"{action!r}")

    @property
    def wire_keys(self) -> tuple[str, ...]:
        """The key names an ``action`` message may hold in this game (sorted)."""
        return tuple(sorted(self.keymap.wire_keys))

    @property
    def controls(self) -> dict[str, Any]:
        """The page's controls: ``keys`` (browser ``KeyboardEvent.code`` -> wire key), and
        ``actions`` (held wire keys joined by ``+`` -> the env's action meaning)."""
        return {"env": self.env_id, "keys": dict(self.keymap.keys),
                "actions": {c: self.action_meanings[a] for c, a in self.keymap.actions.items()}}

    def key_action(self, keys: frozenset[str]) -> int:
        """The env's action id for held wire keys; ValueError naming a key the game lacks."""
        if isinstance(keys, str) or not hasattr(keys, "__iter__"):
            raise ValueError(f"keys must be a set of {list(self.wire_keys)}, got {keys!r}")
        return self.keymap.action(frozenset(keys))

    def set_prompt(self, state: Any, text: str, blend_text: str | None = None,
                   blend_weight: float = 0.0) -> None:
        """A game has no text prompt: ValueError (a freed state's error first), nothing
        changes."""
        self.live(state)
        raise ValueError(f"the game {self.env_id} has no text prompt; steer it with its keys")

    def frame_version(self, **extra: Any) -> str:
        """What decides this backend's frames besides the code: env, size, key map, package
        versions and ``extra`` (JSON-ready; ``engine.studio.savepoint.model_version`` hashes
        it)."""
        return json.dumps({"env": self.env_id, "size": self.size,
                           "keymap": self.keymap.to_json(), "versions": package_versions(),
                           **extra}, sort_keys=True)

    def hash_game(self, h: Any) -> None:
        """This game's code (the backend's module, the keys, env, frames and key-map modules)
        and :meth:`frame_version` into a model-version hash (``SavesState.hash_frames``)."""
        import sys

        from worldstream.engine.studio.savepoint import hash_module_files
        from worldstream.engine.worlds.game import env, frames

        hash_module_files(h, sys.modules[type(self).__module__], sys.modules[__name__], env,
                          frames, keymaps)
        h.update(self.frame_version().encode())
