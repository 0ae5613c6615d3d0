"""Save-point state of the simulator backend (``sim``): the simulator's fields as JSON
scalars, for the state and each chunk of its rewind history."""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np

from worldstream.engine.studio.savepoint import SavepointError

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


def export_sim(state) -> dict[str, Any]:
    # NOTE: the simulator's fields are plain numbers; JSON floats round-trip float64 exactly
    return {"sim": _sim_dict(state.sim), "history": [_sim_dict(s) for s in state.history]}


def import_sim(backend, scalars: dict[str, Any]):
    from worldstream.engine.backends.sim import SimState

    if len(scalars["history"]) > backend.rewind_chunks:
        raise SavepointError("the save point keeps more rewind history than this server")
    sims = [_sim_from(scalars["sim"])] + [_sim_from(d) for d in scalars["history"]]
    return SimState(sims[0], deque(sims[1:]))
