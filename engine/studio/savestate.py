"""A backend state to and from a save point's arrays and scalars, through the backend's
:class:`~engine.core.backend.SavesState` (each family's own save-state module:
``engine/backends/<family>/savestate*.py``); the file around them is
:mod:`engine.studio.savepoint`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from worldstream.engine.core.api import CapacityError
from worldstream.engine.core.backend import SavesState
from worldstream.engine.core.helpers import HelperError
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
    except (CapacityError, SavepointError, HelperError):  # each names its own cause
        raise
    except Exception as err:  # a hand-edited or damaged file that passed the header checks
        raise SavepointError(f"the save point's state does not fit this model ({err!r})") from None
