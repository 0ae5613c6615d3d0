"""A backend state to and from a save point's arrays and scalars, by backend: the built-in
model, the simulator, the avatar world, a game world's env, a game's learned world and
Matrix-Game 2.0 (:mod:`engine.backends.builtin.savestate`, ``savestate_sim``,
``savestate_avatar``, ``savestate_game``, ``savestate_game_world``,
``savestate_matrix_game``); the file around them is :mod:`engine.studio.savepoint`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from worldstream.engine.backends.avatar.savestate import export_avatar, import_avatar
from worldstream.engine.backends.builtin.savestate import export_builtin, import_builtin
from worldstream.engine.backends.game.savestate_sim import check_game, export_game, import_game
from worldstream.engine.backends.game.savestate_world import (
    check_game_world,
    export_game_world,
    import_game_world,
)
from worldstream.engine.backends.matrix_game.savestate import (
    export_matrix_game,
    import_matrix_game,
)
from worldstream.engine.backends.sim.savestate import check_sim, export_sim, import_sim
from worldstream.engine.core.api import CapacityError
from worldstream.engine.core.limits import DIRECTION_KEYS
from worldstream.engine.studio.savepoint import SavepointError


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


def check_saved(backend: Any, session: Any, scalars: dict[str, Any],
                layout: dict[str, tuple[str, tuple[int, ...]]]) -> None:
    """A save point's session (a ``SavedSession``), state scalars and arrays (``layout``:
    name -> (dtype, shape), from the file's header) against the world it loads into, before
    any array is decoded: the held keys are the world's and give the saved action, and each
    family's fields are known and in range, its arrays no larger than the world needs.
    SavepointError (one line) otherwise."""
    _check_action(backend, session)
    if _is_game_env(backend):
        check_game(backend, scalars, layout)
    elif _is_game_world(backend):
        check_game_world(backend, scalars, layout)
    elif backend.name == "sim":
        check_sim(backend, scalars, layout)


def _check_action(backend: Any, session: Any) -> None:
    if "keys" in session.model_fields_set:
        try:
            action = backend.key_action(frozenset(session.keys))
        except ValueError as err:
            raise SavepointError(f"the save point's held keys are not this world's: "
                                 f"{' '.join(str(err).split())[:200]}") from None
        if action != session.action:
            raise SavepointError(f"the save point's action {session.action} is not that of its "
                                 f"held keys {session.keys} ({action})")
    else:  # a file saved before the keys were: an action the world has
        count = getattr(backend, "num_actions", None)
        if count is None:
            keys = tuple(getattr(backend, "wire_keys", None) or DIRECTION_KEYS)[:8]
            possible = {backend.key_action(frozenset(k for j, k in enumerate(keys)
                                                     if i >> j & 1))
                        for i in range(2 ** len(keys))}
        else:
            possible = range(int(count))
        if session.action not in possible:
            raise SavepointError(f"the save point's action {session.action} is not one of "
                                 f"model {backend.name!r}")


def prepare_import(backend: Any, arrays: dict[str, np.ndarray],
                   scalars: dict[str, Any]) -> Callable[[], Any]:
    """:func:`import_state` in two parts: the slow part here, in the caller's thread (a game
    without emulator state in the file replays its actions: seconds), and the returned
    function, cheap, on the engine thread. SavepointError here for contents that do not fit;
    the returned function raises CapacityError or SavepointError like ``import_state``."""
    if not _is_game_env(backend):
        return lambda: import_state(backend, arrays, scalars)
    return _Made(backend, import_state(backend, arrays, scalars))


class _Made:
    """A state made off the engine thread, handed over once; freed if never taken (the
    session ended, the model's memory was full)."""

    def __init__(self, backend: Any, state: Any):
        self.backend, self.state = backend, state

    def __call__(self) -> Any:
        state, self.state = self.state, None
        if state is None:
            raise SavepointError("the loaded state was already taken")
        return state

    def __del__(self) -> None:
        if self.state is not None:
            self.backend.free(self.state)


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
