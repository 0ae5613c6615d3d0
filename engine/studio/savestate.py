"""A backend state to and from a save point's arrays and scalars, by backend: the built-in
model, the simulator, the avatar world, a game world's env, a game's learned world and
Matrix-Game 2.0 (:mod:`engine.studio.savestate_builtin`, ``savestate_sim``,
``savestate_avatar``, ``savestate_game``, ``savestate_game_world``,
``savestate_matrix_game``); the file around them is :mod:`engine.studio.savepoint`."""

from __future__ import annotations

from typing import Any

import numpy as np

from worldstream.engine.core.api import CapacityError
from worldstream.engine.studio.savepoint import SavepointError
from worldstream.engine.studio.savestate_avatar import export_avatar, import_avatar
from worldstream.engine.studio.savestate_builtin import export_builtin, import_builtin
from worldstream.engine.studio.savestate_game import export_game, import_game
from worldstream.engine.studio.savestate_game_world import export_game_world, import_game_world
from worldstream.engine.studio.savestate_matrix_game import (
    export_matrix_game,
    import_matrix_game,
)
from worldstream.engine.studio.savestate_sim import export_sim, import_sim


def export_state(backend: Any, state: Any) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """``(arrays, scalars)`` of a backend state (call where nothing generates it, e.g. the
    engine thread). SavepointError for a backend that cannot save its state."""
    if backend.name == "builtin":
        return export_builtin(backend, state)
    if backend.name == "sim":
        return {}, export_sim(state)
    if backend.name in ("avatar", "avatar-sim"):
        return export_avatar(backend, state)
    if _is_game_env(backend):
        return export_game(state)
    if _is_game_world(backend):
        return export_game_world(state)
    if _is_matrix_game(backend):
        return export_matrix_game(backend, state)
    raise SavepointError(f"model {backend.name!r} cannot save its state")


def import_state(backend: Any, arrays: dict[str, np.ndarray], scalars: dict[str, Any]) -> Any:
    """A new backend state from :func:`export_state`'s output; counts against the backend's
    state budget (free it with ``backend.free``). CapacityError when full, SavepointError for
    contents that do not fit the backend (nothing is held then)."""
    try:
        if backend.name == "builtin":
            return import_builtin(backend, arrays, scalars)
        if backend.name == "sim":
            return import_sim(backend, scalars)
        if backend.name in ("avatar", "avatar-sim"):
            return import_avatar(backend, arrays, scalars)
        if _is_game_env(backend):
            return import_game(backend, arrays, scalars)
        if _is_game_world(backend):
            return import_game_world(backend, arrays, scalars)
        if _is_matrix_game(backend):
            return import_matrix_game(backend, arrays, scalars)
    except (CapacityError, SavepointError):
        raise
    except Exception as err:  # a hand-edited or damaged file that passed the header checks
        raise SavepointError(f"the save point's state does not fit this model ({err!r})") from None
    raise SavepointError(f"model {backend.name!r} cannot load a saved state")


def _is_game_env(backend: Any) -> bool:
    """A game world played by its env (``game-sim:ENV``)."""
    return str(backend.name).startswith("game-sim:")


def _is_game_world(backend: Any) -> bool:
    """A game's learned world (``game-builtin:ENV``)."""
    return str(backend.name).startswith("game-builtin:")


def _is_matrix_game(backend: Any) -> bool:
    """Matrix-Game 2.0 (``matrix-game-2:VARIANT``)."""
    return str(backend.name).startswith("matrix-game-2:")
