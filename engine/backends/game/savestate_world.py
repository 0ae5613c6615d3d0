"""Save-point state of a game's learned world (``game-builtin:ENV``): the model's context now and
before each chunk of the rewind history.

Arrays per context ``P`` (``now``, ``history.0`` ... oldest first): ``P.frames``
``(context, S, S)`` uint8 palette indices (oldest first), ``P.actions`` ``(context - 1,)``
int32 (the action after each frame but the last) and ``P.step`` ``(1,)`` int64, the frame
index the next frame's outcome is drawn at. Scalars: the session seed and the history
length. The weights and palette are not in the file: ``savepoint.model_version`` hashes them,
so a save made with other weights is refused before this module reads it.

A save written while worlds were deterministic (from d42b936 until the outcome code) has no
``P.step``: it reads as 0, which a world without a code never uses.
"""

from __future__ import annotations

from typing import Any, TypeGuard

import numpy as np

from worldstream.engine.core.limits import MAX_SEED
from worldstream.engine.studio.savepoint import SavepointError


def export_game_world(state: Any) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """``(arrays, scalars)`` of a :class:`~engine.backends.game.world.WorldState`."""
    arrays: dict[str, np.ndarray] = {}
    contexts = [("now", state.frames, state.actions, state.step)]
    contexts += [(f"history.{i}", f, a, t) for i, (f, a, t) in enumerate(state.history)]
    for prefix, frames, actions, step in contexts:
        arrays[f"{prefix}.frames"] = np.ascontiguousarray(frames, dtype=np.uint8)
        arrays[f"{prefix}.actions"] = np.asarray(actions, dtype=np.int32)
        arrays[f"{prefix}.step"] = np.asarray([step], dtype=np.int64)
    return arrays, {"seed": int(state.seed), "history": len(state.history)}


_STATE_FIELDS = frozenset({"seed", "history"})
_INT_DTYPES = frozenset({"U8", "I8", "U16", "I16", "U32", "I32", "I64"})


def check_game_world(backend: Any, scalars: dict[str, Any],
                     layout: dict[str, tuple[str, tuple[int, ...]]]) -> None:
    """The state's scalars and arrays (``layout``: name -> (dtype, shape), from the file's
    header) against ``backend``'s model before any array is decoded: known fields only, a
    seed in [0, 2**63), no more history than the backend keeps, each context of the model's
    shape. SavepointError (one line) otherwise."""
    seed, count = scalars.get("seed"), scalars.get("history")
    unknown = sorted(set(scalars) - _STATE_FIELDS)
    if unknown or not (_count(seed) and _count(count)) or seed > MAX_SEED:
        raise SavepointError(f"the save point's state needs a seed in [0, 2**63) and a history "
                             f"length, nothing else; got seed {seed!r:.40}, history "
                             f"{count!r:.40}, unknown {unknown[:3]}")
    if count > backend.rewind_chunks:
        raise SavepointError(f"the save point keeps {count} chunks of history; this backend "
                             f"keeps {backend.rewind_chunks}")
    c, size = backend.context, backend.size
    expected = set()
    for prefix in ["now", *(f"history.{i}" for i in range(count))]:
        for name, shape, needed in ((f"{prefix}.frames", (c, size, size), True),
                                    (f"{prefix}.actions", (c - 1,), True),
                                    (f"{prefix}.step", (1,), False)):  # not in older saves
            got = layout.get(name)
            if got is None and not needed:
                continue
            if got is None or got[0] not in _INT_DTYPES or got[1] != shape:
                raise SavepointError(f"the save point's {name} is {got}; this model keeps "
                                     f"{shape} ints")
            expected.add(name)
    unknown = sorted(set(layout) - expected)
    if unknown:
        raise SavepointError(f"the save point has arrays this model does not keep: "
                             f"{unknown[:3]!r:.200}")


def import_game_world(backend: Any, arrays: dict[str, np.ndarray],
                      scalars: dict[str, Any]) -> Any:
    """A new state of ``backend`` continuing the saved world exactly. SavepointError for a
    context that does not fit the model or more history than the backend keeps."""
    seed, count = scalars.get("seed"), scalars.get("history")
    if not (_count(seed) and _count(count)):
        raise SavepointError(f"the save point's seed and history length are {seed!r} and "
                             f"{count!r}; ints >= 0 expected")
    try:
        prefixes = ["now", *(f"history.{i}" for i in range(count))]
        steps = [_check_step(arrays, p) for p in prefixes]
        contexts = [(arrays[f"{p}.frames"], arrays[f"{p}.actions"], t)
                    for p, t in zip(prefixes, steps, strict=True)]
        now = contexts[0]
        return backend.state_from(seed, now[0], now[1], contexts[1:], step=now[2])
    except KeyError as err:
        raise SavepointError(f"the save point lacks the array {err.args[0]!r}") from None
    except ValueError as err:
        raise SavepointError(f"the save point's state does not fit this model: {err}") from None


def _check_step(arrays: dict[str, np.ndarray], prefix: str) -> int:
    """The context's frame index (0 where an older save has none): one int in [0, 2**63);
    SavepointError otherwise."""
    step = np.asarray(arrays.get(f"{prefix}.step", np.zeros(1, np.int64)))
    if step.shape != (1,) or not np.issubdtype(step.dtype, np.integer) or step[0] < 0 or \
            step[0] > MAX_SEED:
        raise SavepointError(f"the save point's {prefix}.step is {step!r}; one int >= 0 "
                             "expected")
    return int(step[0])


def _count(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


class GameWorldSaves:
    """Save points of a game's learned world (:class:`engine.core.backend.SavesState`): its
    frames are decided by the game's code, the network's code, config and tensors, its
    palette and the decoding's change weight."""

    imports_off_thread = False

    def export_state(self, state):
        return export_game_world(state)

    def check_saved(self, scalars, layout) -> None:
        check_game_world(self, scalars, layout)

    def import_state(self, arrays, scalars):
        return import_game_world(self, arrays, scalars)

    def hash_frames(self, h) -> None:
        import json

        from worldstream.engine.models.game import palette, unet
        from worldstream.engine.models.game import world as world_module
        from worldstream.engine.studio.savepoint import (
            frame_config,
            hash_module_files,
            hash_tensors,
        )

        self.hash_game(h)
        world = self.model
        hash_module_files(h, unet, world_module, palette)
        h.update(json.dumps(frame_config(world.unet.config), sort_keys=True,
                            default=str).encode())
        hash_tensors(h, world.unet, exact=False)
        h.update(np.ascontiguousarray(world.palette.colours, dtype=np.uint8).tobytes())
        h.update(repr(float(world.change_weight)).encode())
