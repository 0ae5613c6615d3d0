"""Save-point state of the built-in model: the state's KV-cache pages in time order, the
retained chunks' latents, memory bases and camera path, the spatial memory's tiles and their
undo records, the text embedding and the RNG state as arrays; the rest as JSON scalars.
Older files without later fields load with the documented defaults."""

from __future__ import annotations

from collections import deque
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, ValidationError

from worldstream.engine.backends.paged_savestate import restored_pages
from worldstream.engine.core.limits import (
    MAX_ATTENTION_CHARS,
    MAX_CHUNK_FRAMES,
    MAX_PROMPT_CHARS,
    MAX_SEED,
)
from worldstream.engine.core.saved import Saved, layout_problem, saved_arrays, values_problem
from worldstream.engine.studio.savepoint import SavepointError, frame_config, hash_tensors

#: generator settings of experiments retired at 60fcd8b, and their defaults
_RETIRED_SETTINGS = {"decode_refining": False, "world_noise_period": 0, "world_noise_hold": 64}


def _optional_float(value) -> float | None:
    """A saved scalar that may be null; ValueError/TypeError for anything but a number."""
    return None if value is None else float(value)


def _optional_colour(value) -> np.ndarray | None:
    """A saved mean colour (three numbers) that may be null; ValueError otherwise."""
    if value is None:
        return None
    colour = np.asarray(value, np.float64)
    if colour.shape != (3,):
        raise ValueError(f"a colour is three numbers, got {value!r}")
    return colour


def _saved_colour(arrays: dict[str, np.ndarray], name: str) -> np.ndarray | None:
    """The colour ``(3,)`` float64 saved as ``name``, None when it is absent; ValueError for
    another shape."""
    return _optional_colour(arrays[name].tolist()) if name in arrays else None


def _t2n(x) -> np.ndarray:
    return x.detach().float().cpu().contiguous().numpy()


#: a count a save point may hold (chunks, pages, ticks, epochs)
_Count = Annotated[StrictInt, Field(ge=0, le=2**31)]
_Finite = Annotated[float, Field(strict=True, allow_inf_nan=False, ge=-1e6, le=1e6)]
_Span = Annotated[list[StrictInt], Field(min_length=2, max_length=2)]


class _Fields(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Table(_Fields):
    num_chunks: _Count
    sink_pages: _Count
    pages: _Count


class _Chunk(_Fields):
    actions: list[_Count] = Field(max_length=MAX_CHUNK_FRAMES)
    position: _Count
    rest_run: _Count
    has: list[Literal["latents", "context"]] = Field(max_length=2)
    #: each memory write undone by a rewind: parts of (tile key, rows, columns)
    undo: list[list[Annotated[list[_Span], Field(min_length=3, max_length=3)]]]


class _Memory(_Fields):
    tile: Annotated[StrictInt, Field(ge=1, le=4096)]
    max_tiles: _Count
    settle_px: _Count
    epoch: _Count
    tick: _Count
    keys: list[_Span]
    used: list[_Count]


class _BuiltinScalars(_Fields):
    """A built-in state's scalars as :func:`export_builtin` writes them (older files lack
    the fields with defaults)."""

    prompt: StrictStr = Field(min_length=1, max_length=MAX_PROMPT_CHARS)
    attention: StrictStr | None = Field(max_length=MAX_ATTENTION_CHARS)
    window_chunks: Annotated[StrictInt, Field(ge=1, le=2**16)]
    needs_recache: StrictBool
    restyle_left: _Count
    guide_left: _Count = 0
    noise_seed: Annotated[StrictInt, Field(ge=0, le=MAX_SEED)] = 0
    detail_reference: _Finite | None = None
    colour_reference: Annotated[list[_Finite], Field(min_length=3, max_length=3)] | None = None
    reference_prompt: StrictStr | None = Field(None, max_length=MAX_PROMPT_CHARS)
    table: _Table
    history: list[_Chunk]
    memory: _Memory


def check_builtin(gen, scalars: dict[str, Any],
                  layout: dict[str, tuple[str, tuple[int, ...]]]) -> None:
    """A built-in state's scalars (known fields only, each of its type and range) against
    the model it loads into: no more pages than its pool, no more chunks than it keeps, a
    memory no larger than its own; its arrays' sizes are checked as the pages are restored.
    SavepointError (one line) otherwise."""
    try:
        saved = _BuiltinScalars.model_validate(scalars)
    except ValidationError as err:
        first = err.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"]) or "state"
        raise SavepointError(f"the save point's built-in state is malformed: {where}: "
                             f"{first['msg']}") from None
    cfg = gen.config
    if saved.table.pages > gen.k_pool.shape[1] or saved.table.sink_pages > saved.table.pages:
        raise SavepointError(f"the save point holds {saved.table.pages} KV pages; this "
                             f"model's pool has {gen.k_pool.shape[1]}")
    if len(saved.history) > cfg.memory_chunks + (1 if cfg.sink else 0):
        raise SavepointError("the save point keeps more chunks than this model")
    if saved.window_chunks > cfg.window_chunks:
        raise SavepointError(f"the save point's window_chunks {saved.window_chunks} is past "
                             f"this model's {cfg.window_chunks}")
    memory, own = saved.memory, gen.new_memory()
    for name in ("tile", "max_tiles", "settle_px"):  # the model's own memory's, exactly
        if getattr(memory, name) != getattr(own, name):
            raise SavepointError(f"the save point's memory.{name} is "
                                 f"{getattr(memory, name)}; this model's is "
                                 f"{getattr(own, name)}")
    if len(memory.keys) != len(memory.used) or len(memory.keys) > memory.max_tiles:
        raise SavepointError("the save point's spatial memory lists its tiles unevenly")
    _check_chunks(gen, saved, layout)
    problem = layout_problem(layout, saved_layout(), saved_sizes(gen))
    if problem:
        raise SavepointError(f"the save point's {problem}")


def saved_layout() -> dict[str, Saved]:
    """The arrays a built-in state is saved as, from the declarations on its fields
    (``BuiltinState``, ``ChunkRecord``, the memory's tiles) and its KV pages."""
    from worldstream.engine.backends.builtin.state import BuiltinState, ChunkRecord
    from worldstream.engine.models.builtin.spatial_memory import _Tile

    tile = saved_arrays(_Tile)
    return {"kv.k": _PAGES, "kv.v": _PAGES, "text": Saved(("D",), "<f4", limit=1e6),
            "rng": Saved(("R",), "|u1"), **saved_arrays(BuiltinState),
            **saved_arrays(ChunkRecord, "h*."),
            **{f"mem.{k}": v.counted() for k, v in tile.items()},
            # an undo record's part: a part of a tile (its span is checked against it)
            **{f"h*.u*.*.{k}": v.loose("T") for k, v in tile.items()}}


#: a state's KV pages: (layers, pages, *one page), float32
_PAGES = Saved(("L", "*", "P0", "P1", "P2"), "<f4", limit=1e6)


def saved_sizes(gen) -> dict[str, int]:
    """The symbols of :func:`saved_layout` for the model ``gen``."""
    import torch

    mc = gen.model.config
    layers, _, *page = gen.k_pool.shape
    return {"F": gen.chunk_frames, "C": mc.latent_channels, "S": mc.latent_size,
            "H": gen.height, "W": gen.width, "D": mc.text_dim, "L": layers,
            **{f"P{i}": n for i, n in enumerate(page)},
            "T": gen.new_memory().tile, "R": torch.Generator().get_state().numel()}


def _check_chunks(gen, saved: _BuiltinScalars,
                  layout: dict[str, tuple[str, tuple[int, ...]]]) -> None:
    """Each retained chunk: the model's frames per chunk and action ids, the arrays it says
    it has, and undo parts inside one tile, each as large as its array."""
    f, tile = gen.chunk_frames, saved.memory.tile
    count = gen.model.config.num_actions
    if len(saved.memory.keys) and layout.get("mem.rgb", ("", (0,)))[1][:1] != \
            (len(saved.memory.keys),):
        raise SavepointError("the save point's memory tiles and their list differ in number")
    for i, chunk in enumerate(saved.history):
        if len(chunk.actions) != f or any(a >= count for a in chunk.actions):
            raise SavepointError(f"the save point's chunk {i} holds {len(chunk.actions)} "
                                 f"actions of ids < {count}; this model: {f} of ids < {count}")
        needed = ["base", "known", "origins", "cam_pos", "cam_vel", *chunk.has]
        missing = [n for n in needed if f"h{i}.{n}" not in layout]
        if missing:
            raise SavepointError(f"the save point's chunk {i} lacks its array {missing[0]}")
        for j, parts in enumerate(chunk.undo):
            for k, (_key, ys, xs) in enumerate(parts):
                rows, cols = ys[1] - ys[0], xs[1] - xs[0]
                if not (0 <= ys[0] < ys[1] <= tile and 0 <= xs[0] < xs[1] <= tile):
                    raise SavepointError(f"the save point's undo part h{i}.u{j}.{k} lies "
                                         f"outside a tile of {tile} px")
                for name, extra in (("rgb", (3,)), ("epoch", ()), ("view", ())):
                    shape = layout.get(f"h{i}.u{j}.{k}.{name}", ("", None))[1]
                    if shape is None or tuple(shape) != (rows, cols, *extra):
                        raise SavepointError(f"the save point's undo part h{i}.u{j}.{k}.{name} "
                                             f"is not {(rows, cols, *extra)}")


def export_builtin(gen, state) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    import torch

    with gen.settled():  # the last chunk's deferred cache fill and memory write first
        if state.freed:
            raise SavepointError("the state was freed")
        pages = state.table.all_pages()
        idx = torch.tensor(pages, dtype=torch.long, device=gen.k_pool.device)
        arrays = {"kv.k": _t2n(gen.k_pool[:, idx]), "kv.v": _t2n(gen.v_pool[:, idx]),
                  "text": _t2n(state.text), "rng": state.rng.get_state().numpy()}
        history = []
        for i, rec in enumerate(state.history):
            for name in ("latents", "base", "known", "context", "skip"):
                value = getattr(rec, name)
                if value is not None:
                    arrays[f"h{i}.{name}"] = _t2n(value)
            arrays[f"h{i}.origins"] = rec.origins
            arrays[f"h{i}.field_times"] = rec.field_times
            arrays[f"h{i}.cam_pos"] = np.asarray(rec.camera[0], np.float64)
            arrays[f"h{i}.cam_vel"] = _t2n(rec.camera[1])
            arrays[f"h{i}.pose"] = np.asarray(rec.pose, np.float64)
            if rec.poses is not None:
                arrays[f"h{i}.poses"] = np.asarray(rec.poses, np.float64)
            for name in ("colour_mean", "colour_reference"):
                if getattr(rec, name) is not None:
                    arrays[f"h{i}.{name}"] = np.asarray(getattr(rec, name), np.float64)
            undo = []
            for j, record in enumerate(rec.undo):
                parts = []
                for k, (key, ys, xs, rgb, epoch, view) in enumerate(record.parts):
                    arrays[f"h{i}.u{j}.{k}.rgb"] = rgb
                    arrays[f"h{i}.u{j}.{k}.epoch"] = epoch
                    arrays[f"h{i}.u{j}.{k}.view"] = view
                    parts.append([list(key), [ys.start, ys.stop], [xs.start, xs.stop]])
                undo.append(parts)
            history.append({"actions": list(rec.actions), "position": rec.position,
                            "rest_run": rec.rest_run,
                            "has": [n for n in ("latents", "context")
                                    if getattr(rec, n) is not None], "undo": undo})
        # NOTE: the spatial memory's tiles are private to it; a save point is the one place
        # that needs all of them, so they are read here rather than widening its API
        mem = state.memory
        keys = list(mem._tiles)
        for name in ("rgb", "epoch", "view"):
            arrays[f"mem.{name}"] = (np.stack([getattr(mem._tiles[k], name) for k in keys])
                                     if keys else np.zeros((0,), np.uint8))
        if state.start_frames is not None:
            arrays["start_frames"] = state.start_frames
        scalars = {
            "prompt": state.prompt,
            "attention": state.attention,
            "window_chunks": state.table.window_chunks,
            "needs_recache": state.needs_recache,
            "restyle_left": state.restyle_left,
            "guide_left": state.guide_left,
            "noise_seed": state.noise_seed,
            "detail_reference": state.detail_reference,
            "colour_reference": (None if state.colour_reference is None
                                 else [float(v) for v in state.colour_reference]),
            "reference_prompt": state.reference_prompt,
            "table": {"num_chunks": state.table.num_chunks,
                      "sink_pages": len(state.table.sink_pages()), "pages": len(pages)},
            "history": history,
            "memory": {"tile": mem.tile, "max_tiles": mem.max_tiles, "settle_px": mem.settle_px,
                       "epoch": mem.epoch, "tick": mem._tick, "keys": [list(k) for k in keys],
                       "used": [mem._used.get(k, 0) for k in keys]},
        }
    return arrays, scalars


def import_builtin(gen, arrays: dict[str, np.ndarray], scalars: dict[str, Any]):
    import torch

    from worldstream.engine.backends.builtin.state import BuiltinState, ChunkRecord
    from worldstream.engine.models.builtin.spatial_memory import SpatialMemory, UndoRecord, _Tile

    problem = values_problem(arrays, saved_layout())
    if problem:
        raise SavepointError(f"the save point's {problem}")
    f = gen.chunk_frames
    n = int(scalars["table"]["pages"])
    sink = int(scalars["table"]["sink_pages"])
    k, v = arrays["kv.k"], arrays["kv.v"]
    want = (gen.k_pool.shape[0], n, *gen.k_pool.shape[2:])
    if k.shape != want or v.shape != want or (n - sink) % f or sink not in (0, f):
        raise SavepointError(f"the save point's KV pages {k.shape} do not fit this model "
                             f"({want})")
    # NOTE: torch.tensor copies: the arrays are read-only views of the save file's bytes
    # (savepoint.decode), which torch.from_numpy would share (and warn of)
    pools = [(gen.k_pool, torch.tensor(k, dtype=gen.k_pool.dtype, device=gen.k_pool.device)),
             (gen.v_pool, torch.tensor(v, dtype=gen.v_pool.dtype, device=gen.v_pool.device))]
    with restored_pages(gen, pools, scalars, f) as (table, attention):
        history = deque()
        for i, h in enumerate(scalars["history"]):
            if gen.model.config.skip_source and f"h{i}.skip" not in arrays:
                raise SavepointError("the save point was made by a model without a "
                                     "second skip source; this one needs it")
            if gen.pose_rig is not None and f"h{i}.poses" not in arrays:
                raise SavepointError("the save point was made by a model without the "
                                     "rig's pose input; this one needs it")

            def get(name, i=i):
                return torch.from_numpy(arrays[f"h{i}.{name}"].copy())

            undo = [UndoRecord([(tuple(key), slice(*ys), slice(*xs),
                                 arrays[f"h{i}.u{j}.{p}.rgb"].copy(),
                                 arrays[f"h{i}.u{j}.{p}.epoch"].copy(),
                                 arrays[f"h{i}.u{j}.{p}.view"].copy())
                                for p, (key, ys, xs) in enumerate(parts)])
                    for j, parts in enumerate(h["undo"])]
            history.append(ChunkRecord(
                get("latents") if "latents" in h["has"] else None, get("base"),
                get("known"), [int(a) for a in h["actions"]], int(h["position"]),
                arrays[f"h{i}.origins"].astype(np.int64),
                (arrays[f"h{i}.cam_pos"].astype(np.float64), get("cam_vel")),
                get("context") if "context" in h["has"] else None, undo,
                field_times=arrays[f"h{i}.field_times"].astype(np.int64),
                rest_run=int(h["rest_run"]),
                # save points from before the base warp hold no pose: at rest
                pose=(arrays[f"h{i}.pose"].astype(np.float64) if f"h{i}.pose" in arrays
                      else np.zeros(2)),
                skip=get("skip") if f"h{i}.skip" in arrays else None,
                poses=(arrays[f"h{i}.poses"].astype(np.float64) if f"h{i}.poses" in arrays
                       else None),
                # save points from before the running mean's reference hold none: the
                # next chunk restarts the mean (as after a prompt switch)
                colour_mean=_saved_colour(arrays, f"h{i}.colour_mean"),
                colour_reference=_saved_colour(arrays, f"h{i}.colour_reference")))
        m = scalars["memory"]
        memory = SpatialMemory(int(m["tile"]), int(m["max_tiles"]), int(m["settle_px"]))
        memory.epoch, memory._tick = int(m["epoch"]), int(m["tick"])
        for t, (key, used) in enumerate(zip(m["keys"], m["used"])):
            key = tuple(int(c) for c in key)
            memory._tiles[key] = _Tile(arrays["mem.rgb"][t].copy(),
                                       arrays["mem.epoch"][t].copy(),
                                       arrays["mem.view"][t].copy())
            memory._owned.add(key)
            memory._used[key] = int(used)
        rng = torch.Generator()
        rng.set_state(torch.from_numpy(arrays["rng"].copy()))
        text = torch.from_numpy(arrays["text"].copy())
        if text.shape != (gen.model.config.text_dim,):
            raise SavepointError(f"the saved prompt embedding is {tuple(text.shape)}")
        # NOTE: files from before 60fcd8b may hold a "backdrop" plate, which only a retired
        # experiment read: ignored
        start = arrays.get("start_frames")
        return BuiltinState(table, str(scalars["prompt"]), text, rng, history,
                            bool(scalars["needs_recache"]), attention=attention,
                            memory=memory,
                            start_frames=None if start is None else start.copy(),
                            restyle_left=int(scalars["restyle_left"]),
                            guide_left=int(scalars.get("guide_left", 0)),
                            noise_seed=int(scalars.get("noise_seed", 0)),
                            detail_reference=_optional_float(
                                scalars.get("detail_reference")),
                            colour_reference=_optional_colour(
                                scalars.get("colour_reference")),
                            # older files: the stream's own prompt
                            reference_prompt=str(scalars.get("reference_prompt",
                                                             scalars["prompt"])))


class BuiltinSaves:
    """Save points of the built-in model (:class:`engine.core.backend.SavesState`); its
    frames are decided by the transformer's and autoencoder's weights and configs, the
    generator settings and the autoencoder's dtype."""

    imports_off_thread = False

    def export_state(self, state):
        return export_builtin(self, state)

    def check_saved(self, scalars, layout) -> None:
        check_builtin(self, scalars, layout)

    def import_state(self, arrays, scalars):
        return import_builtin(self, arrays, scalars)

    def hash_frames(self, h) -> None:
        import dataclasses
        import json

        for module in (self.model, self.ae):
            h.update(json.dumps(frame_config(module.config), sort_keys=True,
                                default=str).encode())
            hash_tensors(h, module, exact=False)
        settings = dataclasses.asdict(self.config)
        settings.pop("cpu_threads")  # frames may differ across thread counts; files do not
        settings.pop("max_states")
        for key, default in _RETIRED_SETTINGS.items():
            if settings.get(key, default) == default:
                settings.pop(key, None)
        if settings.get("colour_prior"):
            settings["colour_prior"].pop("source")  # a note on how it was fitted, not frames
        h.update(json.dumps(settings, sort_keys=True, default=str).encode())
        h.update(str(self.ae_dtype).encode())
