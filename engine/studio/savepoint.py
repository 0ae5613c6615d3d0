"""Save points: a running world written to a file and read back into a new session, exactly.

The file is a safetensors file (a JSON header, then raw arrays; nothing in it is executed when
loading): its arrays are the backend state's tensors (for the built-in model: the keys and
values of the state's KV-cache pages in time order, the retained chunks' latents, memory bases
and camera path, the spatial memory's tiles and their undo records, the text embedding and the
RNG state; the avatar world adds its controls: the expression in force and the speech queued;
Matrix-Game 2.0: :mod:`engine.backends.matrix_game.savestate`),
its metadata ``{"worldstream": JSON}`` holds ``format``, ``model``,
``model_version`` (:func:`model_version`), the engine session's settings (``session``: seed,
prompt, held action and keys, pending mouse motion, chunk size, steps, mode, fork counter)
and the backend state's scalars (``state``). A file made by another model, another version of
its weights or generator settings is refused with a message naming both versions.

Loading a save point into a state continues the world bit for bit as the saved one would
have continued (same machine, same threads): nothing is re-encoded or recomputed. This module
is the file (its format, header checks and model version); a backend state to and from its
arrays and scalars is :mod:`engine.studio.savestate`.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import math
import weakref
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from worldstream.engine.core import fields
from worldstream.engine.core.backend import SavesState, backend_info
from worldstream.engine.core.limits import (
    DIRECTION_KEYS,
    MAX_CHUNK_FRAMES,
    MAX_PROMPT_CHARS,
    MAX_SEED,
    MAX_STEPS,
)
from worldstream.engine.core.reader import read_json
from worldstream.engine.core.saved import SAFETENSORS_DTYPES, nonfinite_array

SAVEPOINT_FORMAT = "worldstream-savepoint/1"
#: the largest save file read (a built-in model state is ~10 MB: KV pages, latents, tiles)
MAX_SAVEPOINT_BYTES = 128 * 2**20
_META_KEY = "worldstream"

_versions: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class SavedSession(BaseModel):
    """The engine session's part of a save file (``meta["session"]``)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    seed: int = Field(ge=0, le=MAX_SEED)
    prompt: str = Field(min_length=1, max_length=MAX_PROMPT_CHARS)
    # the held keys' action id; checked against the world's keys (``check_saved``)
    action: int = Field(ge=0, lt=2**16)
    frame_index: int = Field(ge=0, le=MAX_SEED)
    chunk_frames: int = Field(ge=1, le=MAX_CHUNK_FRAMES)
    steps: int = Field(ge=1, le=MAX_STEPS)
    mode: Literal["responsive", "quality"] | None
    fork_id: int = Field(ge=-1, le=MAX_SEED)
    # the held keys and the mouse motion not yet in a chunk (a mouse model's input); absent
    # in files saved before they were recorded
    keys: list[fields.HeldKey] = Field(default_factory=list, max_length=8)
    pointer: list[fields.PointerDelta] = Field(default_factory=lambda: [0.0, 0.0],
                                               min_length=2, max_length=2)


class SavepointError(ValueError):
    """A save file that cannot be loaded here (damaged, not a save file, another model or
    version); the message is one line for the user."""


# ---------------------------------------------------------------- model version
def hash_module_files(h, *modules) -> None:
    """The source files of ``modules``, in order, into the hash ``h``."""
    for module in modules:
        with open(inspect.getfile(module), "rb") as f:
            h.update(f.read())


#: model-config keys of experiments retired at 60fcd8b, and their defaults
_RETIRED_CONFIG = {"base_warp": None, "noise_correlation": 0.0, "noise_scale": 2.0,
                   "skip_floor": None, "backdrop_fill": False}


def frame_config(config) -> dict:
    """A model config as it decides frames: without diffusers' bookkeeping (where the weights
    were loaded from, which defaults it filled in: a set, whose order changes with the
    process's hash seed) and without retired keys at their defaults."""
    out = {k: v for k, v in dict(config).items()
           if not k.startswith("_") or k == "_class_name"}
    for key, default in _RETIRED_CONFIG.items():
        if out.get(key, default) == default:
            out.pop(key, None)
    return out


def hash_tensors(h, module, exact: bool = True) -> None:
    """A torch module's tensors, name by name: ``exact``, in their own dtype (the cheapest to
    read); else as float32 (the built-in model's and a game world's, as first recorded)."""
    import torch

    for name, tensor in sorted(module.state_dict().items()):
        h.update(name.encode())
        if exact:
            raw = tensor.detach().reshape(-1).contiguous()
            h.update(raw.view(torch.uint8).cpu().numpy().tobytes() if raw.numel() else b"")
        else:
            h.update(tensor.detach().float().cpu().contiguous().numpy().tobytes())


def model_version(backend: Any) -> str:
    """A hex SHA-256 naming what decides a backend's frames from a state: its name, then what
    its family adds (``SavesState.hash_frames``: weights, configs, settings, source), or its
    class for a backend that saves no state. Computed once per backend object (~50 ms;
    Matrix-Game at full size: seconds, ~5 GB of weights)."""
    cached = _versions.get(backend)
    if cached is not None:
        return cached
    h = hashlib.sha256(backend.name.encode())
    if isinstance(backend, SavesState):
        backend.hash_frames(h)
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


#: the keys of a save file's metadata
_META_FIELDS = frozenset({"format", "model", "model_version", "session", "state"})
#: safetensors' dtype names -> numpy's (its files are little-endian; bfloat16 has no numpy
#: dtype and no exporter writes it)
_DTYPES = SAFETENSORS_DTYPES


_Entry = tuple[str, tuple[int, ...], int]


def _entries(data: bytes | bytearray) -> tuple[int, dict[str, _Entry]]:
    """``(base, {name: (dtype, shape, offset)})``: where a save file's arrays start and each
    array's safetensors dtype name, shape and byte offset from ``base``, all checked against
    the header and the file's length (sizes match, the arrays fill the file) so that
    :func:`_arrays` may view the bytes without copying. SavepointError otherwise."""
    header = _header(data)
    base = 8 + int.from_bytes(data[:8], "little")
    entries, spans = {}, []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (start, stop) = entry["dtype"], entry["shape"], entry["data_offsets"]
            # NOTE: Python ints: a header's shape must not overflow into a size that matches
            ok = dtype in _DTYPES and isinstance(shape, list) and \
                all(type(n) is int and n >= 0 for n in (*shape, start, stop)) and \
                stop - start == math.prod(shape) * _DTYPES[dtype].itemsize
        except (TypeError, KeyError, ValueError, AttributeError):
            ok = False
        if not ok:
            raise SavepointError(f"the save file's array {name[:60]!r} is malformed")
        entries[name] = (dtype, tuple(shape), start)
        spans.append((start, stop, name))
    # as safetensors checks: the arrays fill the bytes after the header, in order, no gap,
    # no overlap, nothing after them
    end = 0
    for start, stop, name in sorted(spans):
        if start != end:
            raise SavepointError(f"the save file is damaged (its array {name[:60]!r} overlaps "
                                 "another or leaves a gap)")
        end = stop
    if base + end != len(data):
        raise SavepointError(f"the save file is damaged or cut short (its arrays end at byte "
                             f"{base + end}, the file at {len(data)})")
    return base, entries


def read_layout(data: bytes | bytearray) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Each array of a save file as ``name -> (dtype, shape)`` (safetensors' names: ``U8``,
    ``I32``, ...), from the header alone: checked before any array is decoded or copied.
    SavepointError for a header that does not describe the file's bytes."""
    return {name: (dtype, shape) for name, (dtype, shape, _) in _entries(data)[1].items()}


def _arrays(data: bytes | bytearray) -> dict[str, np.ndarray]:
    """Each array of a save file as a read-only view of ``data``'s bytes: the file is held
    once, not once more per decoded copy (whoever keeps an array copies it; the views keep
    ``data`` alive). SavepointError for a header that does not describe the file's bytes."""
    base, entries = _entries(data)
    out = {}
    for name, (dtype, shape, start) in entries.items():
        count = math.prod(shape)
        if count:
            array = np.frombuffer(data, _DTYPES[dtype], count, base + start).reshape(shape)
        else:  # nothing to view (the offset may be the file's end)
            array = np.empty(shape, _DTYPES[dtype])
        array.flags.writeable = False  # a bytearray's views would be writable
        out[name] = array
    return out


def _header(data: bytes | bytearray) -> dict[str, Any]:
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
    try:  # bounded depth: a nested header once raised RecursionError
        header = read_json(bytes(data[8:8 + size]), "the save file's header", size)
    except ValueError as err:
        raise SavepointError(f"not a worldstream save point ({err})") from None
    if not isinstance(header, dict):
        raise SavepointError("not a worldstream save point (no worldstream header)")
    return header


def read_meta(data: bytes | bytearray) -> dict[str, Any]:
    """The metadata of a save file (the safetensors header only: cheap). SavepointError for a
    file that is not a worldstream save point or is cut short."""
    header = _header(data)
    try:
        text = header["__metadata__"][_META_KEY]
        if not isinstance(text, str):
            raise TypeError(text)
    except (KeyError, TypeError):
        raise SavepointError("not a worldstream save point (no worldstream header)") from None
    try:
        meta = read_json(text, "the save point's metadata", len(text))
    except ValueError as err:
        raise SavepointError(str(err)) from None
    if not isinstance(meta, dict) or meta.get("format") != SAVEPOINT_FORMAT:
        raise SavepointError(f"not a {SAVEPOINT_FORMAT} file (format "
                             f"{meta.get('format') if isinstance(meta, dict) else None!r})")
    unknown = sorted(set(meta) - _META_FIELDS)
    if unknown:
        raise SavepointError(f"the save point has unknown fields {unknown[:4]!r:.200}")
    return meta


def decode(data: bytes | bytearray, backend: Any
           ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """``(arrays, meta)`` of a save file made with ``backend``'s model and version; the arrays
    are read-only views of ``data`` (copy what you keep); ``meta["session"]`` is a
    :class:`SavedSession`.
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
    from worldstream.engine.core.fields import ANY_KEY

    try:
        meta["session"] = SavedSession.model_validate(meta.get("session"),
                                                      context={"keys": ANY_KEY})
    except ValidationError as err:
        first = err.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"]) or "session"
        raise SavepointError(f"the save point's session is malformed: {where}: "
                             f"{first['msg']}") from None
    if not isinstance(meta.get("state"), dict):  # read as meta["state"] by its loaders
        raise SavepointError("the save point's state is missing or not a JSON object")
    # NOTE: every field against the world it loads into, and every array's size, before any
    # array is decoded: a 16 MB list of actions once became 600 MB of rewind snapshots
    check_saved(backend, meta["session"], meta["state"], read_layout(data))
    arrays = _arrays(data)
    # NOTE: every family's floating-point arrays (latents, KV pages, text embeddings...): a
    # NaN loaded with 200 and ended the session at its next chunk
    bad = nonfinite_array(arrays)
    if bad is not None:
        raise SavepointError(f"the save point's array {bad[:60]} holds NaN or infinite values")
    return arrays, meta


def check_saved(backend: Any, session: Any, scalars: dict[str, Any],
                layout: dict[str, tuple[str, tuple[int, ...]]]) -> None:
    """A save point's session (a ``SavedSession``), state scalars and arrays (``layout``:
    name -> (dtype, shape), from the file's header) against the world it loads into, before
    any array is decoded: the held keys are the world's and give the saved action, and each
    family's fields are known and in range, its arrays no larger than the world needs.
    SavepointError (one line) otherwise."""
    _check_action(backend, session)
    if not isinstance(backend, SavesState):
        raise SavepointError(f"model {backend.name!r} cannot load its state")
    backend.check_saved(scalars, layout)


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


def file_sha256(data: bytes | bytearray) -> str:
    return hashlib.sha256(data).hexdigest()
