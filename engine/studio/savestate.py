"""A backend state to and from a save point's arrays and scalars, through the backend's
:class:`~engine.core.backend.SavesState` (each family's own save-state module:
``engine/backends/<family>/savestate*.py``); the file around them is
:mod:`engine.studio.savepoint`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from worldstream.engine.core.api import CapacityError
from worldstream.engine.core.backend import SavesState, backend_info
from worldstream.engine.core.limits import DIRECTION_KEYS
from worldstream.engine.studio.savepoint import SavepointError


def _saves(backend: Any, verb: str) -> SavesState:
    """``backend`` as a :class:`SavesState`; SavepointError for one that saves no state."""
    if not isinstance(backend, SavesState):
        raise SavepointError(f"model {backend.name!r} cannot {verb} its state")
    return backend


def export_state(backend: Any, state: Any) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """``(arrays, scalars)`` of a backend state (call where nothing generates it, e.g. the
    engine thread). SavepointError for a backend that cannot save its state."""
    return _saves(backend, "save").export_state(state)


def check_saved(backend: Any, session: Any, scalars: dict[str, Any],
                layout: dict[str, tuple[str, tuple[int, ...]]]) -> None:
    """A save point's session (a ``SavedSession``), state scalars and arrays (``layout``:
    name -> (dtype, shape), from the file's header) against the world it loads into, before
    any array is decoded: the held keys are the world's and give the saved action, and each
    family's fields are known and in range, its arrays no larger than the world needs.
    SavepointError (one line) otherwise."""
    _check_action(backend, session)
    _saves(backend, "load").check_saved(scalars, layout)


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
        info = backend_info(backend)
        count = info.num_actions
        if count is None:
            keys = tuple(info.wire_keys or DIRECTION_KEYS)[:8]
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
    if not _saves(backend, "load").imports_off_thread:
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
    saves = _saves(backend, "load")
    try:
        return saves.import_state(arrays, scalars)
    except (CapacityError, SavepointError):
        raise
    except Exception as err:  # a hand-edited or damaged file that passed the header checks
        raise SavepointError(f"the save point's state does not fit this model ({err!r})") from None
