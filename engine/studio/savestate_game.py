"""Save-point state of a game world's env backend (``game-sim:ENV``): the env's snapshot now and
before each chunk of the rewind history.

Arrays per snapshot ``P`` (``now``, ``history.0`` ... oldest first): ``P.frame`` ``(S, S, 3)``
uint8, ``P.actions`` ``(n,)`` int32 (the episode's actions so far) and, for an env with a
native state (ALE's ``cloneState``), ``P.native`` ``(m,)`` uint8 (its serialized bytes).
Scalars: the session seed, and per snapshot its episode seed, episode index and ``done``. An
env without a native state is restored by replaying its episode's actions from its seed.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from worldstream.engine.studio.savepoint import SavepointError


def _snapshot_parts(prefix: str, snap: Any, episode: int,
                    arrays: dict[str, np.ndarray]) -> dict[str, Any]:
    arrays[f"{prefix}.frame"] = np.ascontiguousarray(snap.frame, dtype=np.uint8)
    arrays[f"{prefix}.actions"] = np.asarray(snap.actions, dtype=np.int32).reshape(-1)
    native = snap.native
    if native is not None and hasattr(native, "serialize"):  # ALE
        arrays[f"{prefix}.native"] = np.frombuffer(native.serialize(), dtype=np.uint8).copy()
    return {"seed": int(snap.seed), "episode": int(episode), "done": bool(snap.done)}


def export_game(state: Any) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """``(arrays, scalars)`` of a :class:`~engine.backends.game_env.GameState`."""
    arrays: dict[str, np.ndarray] = {}
    now = _snapshot_parts("now", *state.snapshot(), arrays)
    history = [_snapshot_parts(f"history.{i}", snap, episode, arrays)
               for i, (snap, episode) in enumerate(state.history)]
    return arrays, {"seed": int(state.seed), "now": now, "history": history}


def _int(value: Any, low: int, high: int | None = None) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low and (
        high is None or value < high)


def _snapshot_from(prefix: str, meta: dict[str, Any], arrays: dict[str, np.ndarray],
                   backend: Any) -> tuple[Any, int]:
    from worldstream.engine.worlds.game.env import Snapshot

    if not isinstance(meta, dict) or not _int(meta.get("seed"), 0, 2**31) or \
            not _int(meta.get("episode"), 0) or not isinstance(meta.get("done"), bool):
        raise SavepointError(f"the save point's snapshot {prefix} is {meta!r:.200}; a seed in "
                             "[0, 2**31), an episode >= 0 and done (a bool) expected")
    frame = arrays[f"{prefix}.frame"]
    if frame.shape != (backend.size, backend.size, 3) or frame.dtype != np.uint8:
        raise SavepointError(f"the save point's frames are {frame.shape} {frame.dtype}; this "
                             f"game streams ({backend.size}, {backend.size}, 3) uint8")
    actions = arrays[f"{prefix}.actions"]
    if actions.ndim != 1 or not np.issubdtype(actions.dtype, np.integer) or (
            actions.size and not 0 <= actions.min() <= actions.max() < backend.num_actions):
        raise SavepointError(f"the save point's actions are not actions of {backend.env_id}")
    native = None
    if f"{prefix}.native" in arrays:
        import ale_py

        native = ale_py.ALEState(arrays[f"{prefix}.native"].tobytes())
    snap = Snapshot(int(meta["seed"]), tuple(int(a) for a in actions), native, frame.copy(),
                    bool(meta["done"]))
    return snap, int(meta["episode"])


def import_game(backend: Any, arrays: dict[str, np.ndarray], scalars: dict[str, Any]) -> Any:
    """A new state of ``backend`` continuing the saved game exactly. SavepointError for more
    history than the backend keeps or contents that do not fit its game."""
    if not isinstance(scalars.get("history"), list) or not _int(scalars.get("seed"), 0):
        raise SavepointError("the save point's state needs a history list and a seed >= 0")
    if len(scalars["history"]) > backend.rewind_chunks:
        raise SavepointError("the save point keeps more rewind history than this server")
    snap, episode = _snapshot_from("now", scalars["now"], arrays, backend)
    history = [_snapshot_from(f"history.{i}", meta, arrays, backend)
               for i, meta in enumerate(scalars["history"])]
    native = getattr(backend, "native_state", False)
    for prefix, s in [("now", snap), *((f"history.{i}", h) for i, (h, _) in enumerate(history))]:
        if native and s.native is None:  # dropped by hand: it would replay every action
            raise SavepointError(f"the save point's snapshot {prefix} lacks the emulator state")
    state = backend.state_from(scalars["seed"], episode, snap, history)
    try:
        if native:
            _check_history(state, snap, history)
    except BaseException:
        backend.free(state)
        raise
    return state


def _check_history(state: Any, now: Any, history: list[tuple[Any, int]]) -> None:
    """Restore each emulator state of the history once (a rewind restores them later, on the
    engine thread, where a damaged one failed the session), then ``now`` again."""
    for i, (snap, _) in enumerate(history):
        try:
            state.game.restore(snap)
        except Exception as err:
            raise SavepointError(f"the save point's snapshot history.{i} is damaged "
                                 f"({type(err).__name__})") from None
    state.game.restore(now)
