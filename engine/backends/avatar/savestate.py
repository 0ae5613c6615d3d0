"""Save-point state of the avatar backends (``avatar``: the model; ``avatar-sim``: the
simulator) and of the session's avatar controls (the expression in force, the speech queued).
The model's inner state is the built-in model's (:mod:`engine.backends.builtin.savestate`)."""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np

from worldstream.engine.backends.builtin.savestate import export_builtin, import_builtin
from worldstream.engine.studio.savepoint import SavepointError, hash_module_files

_AVATAR_SIM_FIELDS = ("seed", "look", "t", "yaw", "pitch", "gaze", "_gaze_target",
                      "_next_saccade", "_next_blink", "_blink_frame", "face", "mouth_open",
                      "mouth_width", "_phase")


def _avatar_sim_dict(sim) -> dict[str, Any]:
    out = {}
    for name in _AVATAR_SIM_FIELDS:
        value = getattr(sim, name)
        out[name] = value.tolist() if isinstance(value, np.ndarray) else value
    # NOTE: PCG64's state is two 128-bit ints; Python's json writes and reads them exactly
    out["rng"] = sim._rng.bit_generator.state
    return out


def _avatar_sim_from(d: dict[str, Any]):
    from worldstream.engine.worlds.avatar.simulator import AvatarSimulator

    sim = AvatarSimulator(int(d["seed"]), str(d["look"]))
    for name in ("t", "_next_saccade", "_next_blink", "_blink_frame"):
        setattr(sim, name, int(d[name]))
    for name in ("yaw", "pitch", "mouth_open", "mouth_width"):
        setattr(sim, name, float(d[name]))
    for name, size in (("gaze", 2), ("_gaze_target", 2), ("_phase", 3),
                       ("face", sim.face.size)):
        setattr(sim, name, np.array(d[name], np.float64).reshape(size))
    sim._rng.bit_generator.state = d["rng"]
    return sim


def _controls_dict(controls) -> dict[str, Any]:
    return {"expression": controls.expression, "speech": list(controls.speech)}


def _controls_from(d: dict[str, Any]):
    from worldstream.engine.worlds.avatar.actions import NUM_EXPRESSIONS, AvatarControls
    from worldstream.engine.worlds.avatar.visemes import NUM_VISEMES

    expression, speech = d["expression"], d["speech"]
    if not (isinstance(expression, int) and 0 <= expression < NUM_EXPRESSIONS
            and all(isinstance(v, int) and 0 <= v < NUM_VISEMES for v in speech)):
        raise SavepointError("the save point's avatar controls are out of range")
    return AvatarControls(expression, deque(speech))


def export_avatar(backend, state) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    backend.live(state)
    controls = {"controls": _controls_dict(state.controls),
                "controls_history": [_controls_dict(c) for c in state.history]}
    if backend.name == "avatar":
        arrays, inner = export_builtin(backend.builtin, state.inner)
        return arrays, {"inner": inner, **controls}
    sim, sims = state.inner
    return {}, {"sim": _avatar_sim_dict(sim), "sims": [_avatar_sim_dict(x) for x in sims],
                **controls}


def import_avatar(backend, arrays: dict[str, np.ndarray], scalars: dict[str, Any]):
    from worldstream.engine.backends.avatar.state import AvatarState

    controls = _controls_from(scalars["controls"])
    history = deque(_controls_from(c) for c in scalars["controls_history"])
    # NOTE: the model's controls keep one record more than its chunks (avatar.generate)
    if len(history) > backend.rewind_chunks + 1:
        raise SavepointError("the save point keeps more rewind history than this server")
    if backend.name == "avatar":
        inner = import_builtin(backend.builtin, arrays, scalars["inner"])
    else:
        if len(scalars["sims"]) > backend.rewind_chunks:
            raise SavepointError("the save point keeps more rewind history than this server")
        inner = (_avatar_sim_from(scalars["sim"]),
                 deque(_avatar_sim_from(d) for d in scalars["sims"]))
    return AvatarState(inner, controls, history)


class AvatarSaves:
    """Save points of the avatar world, learned or simulated
    (:class:`engine.core.backend.SavesState`); the controls' source (keys, expressions and
    speech to action ids) decides frames as much as the model or the simulator does."""

    imports_off_thread = False

    def export_state(self, state):
        return export_avatar(self, state)

    def check_saved(self, scalars, layout) -> None:
        pass  # the wrapped state's own checks run as it is imported

    def import_state(self, arrays, scalars):
        return import_avatar(self, arrays, scalars)

    def hash_frames(self, h) -> None:
        from worldstream.engine.worlds.avatar import actions, visemes

        hash_module_files(h, actions, visemes)
        self.hash_renderer(h)

    def hash_renderer(self, h) -> None:
        """What draws the frames: the simulator's source (the learned avatar overrides it)."""
        from worldstream.engine.worlds.avatar import looks, simulator

        hash_module_files(h, simulator, looks)
