"""Save-point state of the simulator backend (``sim``): the simulator's fields as JSON
scalars, for the state and each chunk of its rewind history."""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np

from worldstream.engine.core.limits import MAX_SEED
from worldstream.engine.studio.savepoint import SavepointError, hash_module_files

_SIM_FIELDS = ("seed", "scene", "_prev_scene", "_transition", "pos", "vel", "facing", "t")


def _sim_dict(sim) -> dict[str, Any]:
    out = {}
    for name in _SIM_FIELDS:
        value = getattr(sim, name)
        out[name] = value.tolist() if isinstance(value, np.ndarray) else value
    out["_transition_len"] = getattr(sim, "_transition_len", None)
    return out


def _sim_from(d: dict[str, Any]):
    from worldstream.engine.worlds.simulator import WorldSimulator

    sim = WorldSimulator(seed=int(d["seed"]), scene=str(d["scene"]))
    sim._prev_scene = str(d["_prev_scene"])
    sim._transition = int(d["_transition"])
    if d.get("_transition_len") is not None:
        sim._transition_len = int(d["_transition_len"])
    sim.pos = np.array(d["pos"], np.float64).reshape(2)
    sim.vel = np.array(d["vel"], np.float64).reshape(2)
    sim.facing = tuple(int(v) for v in d["facing"])
    sim.t = int(d["t"])
    return sim


#: the furthest the camera travels from the origin, world px (a float64 keeps whole pixels)
_MAX_POSITION = 2.0**50


def _check_sim_dict(d: Any, where: str) -> None:
    from worldstream.engine.worlds import scenes

    def count(v: Any, high: int = MAX_SEED) -> bool:
        return type(v) is int and 0 <= v <= high

    def vector(v: Any, kind: type, bound: float) -> bool:
        return isinstance(v, list) and len(v) == 2 and all(
            type(x) in (kind, int) and np.isfinite(x) and abs(x) <= bound for x in v)

    ok = isinstance(d, dict) and set(d) == {*_SIM_FIELDS, "_transition_len"} and \
        count(d["seed"]) and isinstance(d["scene"], str) and d["scene"] in scenes.SCENES and \
        isinstance(d["_prev_scene"], str) and d["_prev_scene"] in scenes.SCENES and \
        count(d["_transition"], 2**31) and \
        (d["_transition_len"] is None or count(d["_transition_len"], 2**31)) and \
        (d["_transition"] == 0 or (d["_transition_len"] or 0) >= max(d["_transition"], 1)) and \
        vector(d["pos"], float, _MAX_POSITION) and vector(d["vel"], float, 2.0**20) and \
        vector(d["facing"], int, 1) and count(d["t"])
    if not ok:
        raise SavepointError(f"the save point's {where} is not a simulator's state: "
                             f"{str(d)[:160]}")


def check_sim(backend, scalars: dict[str, Any],
              layout: dict[str, tuple[str, tuple[int, ...]]]) -> None:
    """The simulator's fields (known names only, finite, in range) and its history length;
    SavepointError (one line) otherwise. The simulator keeps no arrays."""
    history = scalars.get("history")
    if set(scalars) != {"sim", "history"} or not isinstance(history, list) or layout:
        raise SavepointError("the save point's state is not a simulator's: sim, history and "
                             "no arrays expected")
    if len(history) > backend.rewind_chunks:
        raise SavepointError("the save point keeps more rewind history than this server")
    for where, d in (("state.sim", scalars["sim"]),
                     *((f"state.history.{i}", d) for i, d in enumerate(history))):
        _check_sim_dict(d, where)


def export_sim(state) -> dict[str, Any]:
    # NOTE: the simulator's fields are plain numbers; JSON floats round-trip float64 exactly
    return {"sim": _sim_dict(state.sim), "history": [_sim_dict(s) for s in state.history]}


def import_sim(backend, scalars: dict[str, Any]):
    from worldstream.engine.backends.sim.state import SimState

    if len(scalars["history"]) > backend.rewind_chunks:
        raise SavepointError("the save point keeps more rewind history than this server")
    sims = [_sim_from(scalars["sim"])] + [_sim_from(d) for d in scalars["history"]]
    return SimState(sims[0], deque(sims[1:]))


class SimSaves:
    """Save points of the landscape simulator (:class:`engine.core.backend.SavesState`); its
    frames are decided by the simulator's and the scenes' source."""

    imports_off_thread = False

    def export_state(self, state):
        return {}, export_sim(state)

    def check_saved(self, scalars, layout) -> None:
        check_sim(self, scalars, layout)

    def import_state(self, arrays, scalars):
        return import_sim(self, scalars)

    def hash_frames(self, h) -> None:
        from worldstream.engine.worlds import scenes, simulator

        hash_module_files(h, simulator, scenes)
