"""Save points: a running world written to a file and read back into a new session, exactly.

The file is a safetensors file (a JSON header, then raw arrays; nothing in it is executed when
loading): its arrays are the backend state's tensors (for the built-in model: the keys and
values of the state's KV-cache pages in time order, the retained chunks' latents, memory bases
and camera path, the spatial memory's tiles and their undo records, the text embedding and the
RNG state; the avatar world adds its controls: the expression in force and the speech queued),
its metadata ``{"worldstream": JSON}`` holds ``format``, ``model``,
``model_version`` (:func:`model_version`), the engine session's settings (``session``: seed,
prompt, held action, chunk size, steps, mode, fork counter) and the backend
state's scalars (``state``). A file made by another model, another version of its weights or
generator settings is refused with a message naming both versions.

Loading a save point into a state continues the world bit for bit as the saved one would
have continued (same machine, same threads): nothing is re-encoded or recomputed.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import weakref
from collections import deque
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from worldstream.engine.core.api import CapacityError
from worldstream.engine.core.limits import MAX_CHUNK_FRAMES, MAX_PROMPT_CHARS, MAX_STEPS

SAVEPOINT_FORMAT = "worldstream-savepoint/1"
#: the largest save file read (a built-in model state is ~10 MB: KV pages, latents, tiles)
MAX_SAVEPOINT_BYTES = 128 * 2**20
_META_KEY = "worldstream"

_versions: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class SavedSession(BaseModel):
    """The engine session's part of a save file (``meta["session"]``)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    seed: int = Field(ge=0)
    prompt: str = Field(min_length=1, max_length=MAX_PROMPT_CHARS)
    action: int = Field(ge=0, lt=2**16)
    frame_index: int = Field(ge=0)
    chunk_frames: int = Field(ge=1, le=MAX_CHUNK_FRAMES)
    steps: int = Field(ge=1, le=MAX_STEPS)
    mode: Literal["responsive", "quality"] | None
    fork_id: int = Field(ge=-1)


class SavepointError(ValueError):
    """A save file that cannot be loaded here (damaged, not a save file, another model or
    version); the message is one line for the user."""


# ---------------------------------------------------------------- model version
def _hash_module_files(h, *modules) -> None:
    for module in modules:
        with open(inspect.getfile(module), "rb") as f:
            h.update(f.read())


def model_version(backend: Any) -> str:
    """A hex SHA-256 naming what decides a backend's frames from a state: for the built-in
    model its weights (transformer and autoencoder tensors), their configs and the generator
    settings; for the simulator its source. Computed once per backend object (~50 ms)."""
    cached = _versions.get(backend)
    if cached is not None:
        return cached
    h = hashlib.sha256(backend.name.encode())
    if backend.name == "builtin":
        import dataclasses

        for module in (backend.model, backend.ae):
            h.update(json.dumps(dict(module.config), sort_keys=True, default=str).encode())
            for name, tensor in sorted(module.state_dict().items()):
                h.update(name.encode())
                h.update(tensor.detach().float().cpu().contiguous().numpy().tobytes())
        settings = dataclasses.asdict(backend.config)
        settings.pop("cpu_threads")  # frames may differ across thread counts; files do not
        settings.pop("max_states")
        if settings.get("colour_prior"):
            settings["colour_prior"].pop("source")  # a note on how it was fitted, not frames
        h.update(json.dumps(settings, sort_keys=True, default=str).encode())
        h.update(str(backend.ae_dtype).encode())
    elif backend.name == "sim":
        from worldstream.engine.worlds import scenes, simulator

        _hash_module_files(h, simulator, scenes)
    elif backend.name in ("avatar", "avatar-sim"):
        from worldstream.engine.worlds.avatar import actions, looks, simulator, visemes

        # the controls turn keys, expressions and speech into action ids: their source decides
        # frames as much as the model or the simulator does
        _hash_module_files(h, actions, visemes)
        if backend.name == "avatar":
            h.update(model_version(backend.gen).encode())
        else:
            _hash_module_files(h, simulator, looks)
    else:
        h.update(repr(type(backend)).encode())
    version = h.hexdigest()
    _versions[backend] = version
    return version


# ---------------------------------------------------------------- file format
def encode(arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> bytes:
    """A save file's bytes from its arrays and its JSON-ready metadata."""
    from safetensors.numpy import save

    return save({k: np.ascontiguousarray(v) for k, v in arrays.items()},
                metadata={_META_KEY: json.dumps(meta)})


def read_meta(data: bytes) -> dict[str, Any]:
    """The metadata of a save file (the safetensors header only: cheap). SavepointError for a
    file that is not a worldstream save point or is cut short."""
    if not isinstance(data, bytes | bytearray):
        raise SavepointError("a save point must be bytes")
    if len(data) > MAX_SAVEPOINT_BYTES:
        raise SavepointError(f"the save file is {len(data)} bytes; the limit is "
                             f"{MAX_SAVEPOINT_BYTES}")
    if len(data) < 8:
        raise SavepointError("not a worldstream save point (the file is empty or cut short)")
    size = int.from_bytes(data[:8], "little")
    if size > len(data) - 8:
        raise SavepointError("not a worldstream save point, or one cut short (its header "
                             "is longer than the file)")
    try:
        header = json.loads(bytes(data[8:8 + size]))
        meta = json.loads(header["__metadata__"][_META_KEY])
    except (ValueError, KeyError, TypeError):
        raise SavepointError("not a worldstream save point (no worldstream header)") from None
    if not isinstance(meta, dict) or meta.get("format") != SAVEPOINT_FORMAT:
        raise SavepointError(f"not a {SAVEPOINT_FORMAT} file (format "
                             f"{meta.get('format') if isinstance(meta, dict) else None!r})")
    return meta


def decode(data: bytes, backend: Any) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """``(arrays, meta)`` of a save file made with ``backend``'s model and version;
    ``meta["session"]`` is a :class:`SavedSession`.
    SavepointError naming the problem: not a save file, cut short or damaged, another model,
    another model version."""
    meta = read_meta(data)
    if meta.get("model") != backend.name:
        raise SavepointError(f"this save point is of model {meta.get('model')!r}; this server "
                             f"runs {backend.name!r}")
    version = model_version(backend)
    if meta.get("model_version") != version:
        raise SavepointError(
            f"this save point was made with another version of model {backend.name!r} "
            f"({str(meta.get('model_version'))[:12]}, this one is {version[:12]}): different "
            "weights or generator settings cannot continue it")
    from safetensors import SafetensorError
    from safetensors.numpy import load

    try:
        arrays = load(bytes(data))
    except (SafetensorError, ValueError) as err:
        raise SavepointError(f"the save file is damaged or cut short ({err})") from None
    try:
        meta["session"] = SavedSession.model_validate(meta.get("session"))
    except ValidationError as err:
        first = err.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"]) or "session"
        raise SavepointError(f"the save point's session is malformed: {where}: "
                             f"{first['msg']}") from None
    return arrays, meta


def file_sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# ---------------------------------------------------------------- backend states
def export_state(backend: Any, state: Any) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """``(arrays, scalars)`` of a backend state (call where nothing generates it, e.g. the
    engine thread). SavepointError for a backend that cannot save its state."""
    if backend.name == "builtin":
        return _export_builtin(backend, state)
    if backend.name == "sim":
        return {}, _export_sim(state)
    if backend.name in ("avatar", "avatar-sim"):
        return _export_avatar(backend, state)
    raise SavepointError(f"model {backend.name!r} cannot save its state")


def import_state(backend: Any, arrays: dict[str, np.ndarray], scalars: dict[str, Any]) -> Any:
    """A new backend state from :func:`export_state`'s output; counts against the backend's
    state budget (free it with ``backend.free``). CapacityError when full, SavepointError for
    contents that do not fit the backend (nothing is held then)."""
    try:
        if backend.name == "builtin":
            return _import_builtin(backend, arrays, scalars)
        if backend.name == "sim":
            return _import_sim(backend, scalars)
        if backend.name in ("avatar", "avatar-sim"):
            return _import_avatar(backend, arrays, scalars)
    except (CapacityError, SavepointError):
        raise
    except Exception as err:  # a hand-edited or damaged file that passed the header checks
        raise SavepointError(f"the save point's state does not fit this model ({err!r})") from None
    raise SavepointError(f"model {backend.name!r} cannot load a saved state")


# -- simulator
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


def _export_sim(state) -> dict[str, Any]:
    # NOTE: the simulator's fields are plain numbers; JSON floats round-trip float64 exactly
    return {"sim": _sim_dict(state.sim), "history": [_sim_dict(s) for s in state.history]}


def _import_sim(backend, scalars: dict[str, Any]):
    from worldstream.engine.backends.sim import SimState

    if len(scalars["history"]) > backend.rewind_chunks:
        raise SavepointError("the save point keeps more rewind history than this server")
    sims = [_sim_from(scalars["sim"])] + [_sim_from(d) for d in scalars["history"]]
    return SimState(sims[0], deque(sims[1:]))


# -- avatar (the model or the simulator, and the session's controls)
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


def _export_avatar(backend, state) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    backend._live(state)
    controls = {"controls": _controls_dict(state.controls),
                "controls_history": [_controls_dict(c) for c in state.history]}
    if backend.name == "avatar":
        arrays, inner = _export_builtin(backend.gen, state.inner)
        return arrays, {"inner": inner, **controls}
    sim, sims = state.inner
    return {}, {"sim": _avatar_sim_dict(sim), "sims": [_avatar_sim_dict(x) for x in sims],
                **controls}


def _import_avatar(backend, arrays: dict[str, np.ndarray], scalars: dict[str, Any]):
    from worldstream.engine.backends.avatar_sim import AvatarState

    controls = _controls_from(scalars["controls"])
    history = deque(_controls_from(c) for c in scalars["controls_history"])
    # NOTE: the model's controls keep one record more than its chunks (avatar.generate)
    if len(history) > backend.rewind_chunks + 1:
        raise SavepointError("the save point keeps more rewind history than this server")
    if backend.name == "avatar":
        inner = _import_builtin(backend.gen, arrays, scalars["inner"])
    else:
        if len(scalars["sims"]) > backend.rewind_chunks:
            raise SavepointError("the save point keeps more rewind history than this server")
        inner = (_avatar_sim_from(scalars["sim"]),
                 deque(_avatar_sim_from(d) for d in scalars["sims"]))
    return AvatarState(inner, controls, history)


# -- built-in model
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


def _export_builtin(gen, state) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    import torch

    with gen._settled():  # the last chunk's deferred cache fill and memory write first
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
        if state.backdrop is not None:
            arrays["backdrop"] = state.backdrop
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


def _import_builtin(gen, arrays: dict[str, np.ndarray], scalars: dict[str, Any]):
    import torch

    from worldstream import kernels
    from worldstream.engine.backends.builtin import BuiltinState, _ChunkRecord
    from worldstream.engine.core.kv_cache import PageTable
    from worldstream.engine.models.builtin.spatial_memory import SpatialMemory, UndoRecord, _Tile

    cfg, f = gen.config, gen.chunk_frames
    n = int(scalars["table"]["pages"])
    sink = int(scalars["table"]["sink_pages"])
    k, v = arrays["kv.k"], arrays["kv.v"]
    want = (gen.k_pool.shape[0], n, *gen.k_pool.shape[2:])
    if k.shape != want or v.shape != want or (n - sink) % f or sink not in (0, f):
        raise SavepointError(f"the save point's KV pages {k.shape} do not fit this model "
                             f"({want})")
    with gen._settled():
        pages = gen.allocator.allocate(n) if n else []
        if pages is None:
            raise CapacityError("KV page pool exhausted", 2.0)
        table = PageTable(gen.allocator, pages_per_chunk=f, window_chunks=cfg.window_chunks,
                          sink=cfg.sink, max_chunks=cfg.memory_chunks)
        try:
            idx = torch.tensor(pages, dtype=torch.long, device=gen.k_pool.device)
            gen.k_pool[:, idx] = torch.from_numpy(k).to(gen.k_pool.device, gen.k_pool.dtype)
            gen.v_pool[:, idx] = torch.from_numpy(v).to(gen.v_pool.device, gen.v_pool.dtype)
            if sink:
                table.append_chunk(pages[:sink])
            for start in range(sink, n, f):
                table.append_chunk(pages[start:start + f])
            table.num_chunks = int(scalars["table"]["num_chunks"])
            table.window_chunks = int(scalars["window_chunks"])
            attention = scalars["attention"]
            if attention is not None:
                attention = kernels.resolve_backend(str(attention), gen.device)
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
                history.append(_ChunkRecord(
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
            start = arrays.get("start_frames")
            plate = arrays.get("backdrop")  # older files: none (the rig fills from around)
            if plate is not None and (plate.shape != (gen.height, gen.width, 3)
                                      or plate.dtype != np.uint8):
                raise SavepointError(f"the saved backdrop is {plate.shape} {plate.dtype}")
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
                                                                 scalars["prompt"])),
                                backdrop=None if plate is None else plate.copy())
        except BaseException:
            held = set(table.all_pages())
            table.free()
            rest = [p for p in pages if p not in held]  # allocated, not yet in the table
            if rest:
                gen.allocator.decref(rest)
            raise
