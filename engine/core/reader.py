"""The one reader of what a user hands over: files (input logs, save points' headers, stories,
action scripts, key maps, settings files, model metadata) and values (``--set``). Each is
bounded in size before it is read and in nesting depth before it is parsed (Python's JSON
parser raises RecursionError at ~1,000 levels: 2 KB of brackets), then validated against a
typed model (pydantic) with ranges.

Every failure is one :class:`InputError` line naming the file (or value) and the field:
``story.json: beats.3.duration_s: Input should be less than or equal to 60``. It is a
ValueError: the CLI exits 2 on it, the server answers 400.
"""

from __future__ import annotations

import dataclasses
import json
import re
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import annotated_types
import numpy as np
from pydantic import BaseModel, TypeAdapter, ValidationError

#: the deepest nesting of arrays/objects a file may have (the deepest format needs 6: a
#: save point's undo records)
MAX_FILE_DEPTH = 32

#: the largest metadata file read (a world's ``world.json``, a dataset's ``meta.json``,
#: ``training.json``, a colour prior: a few KB)
MAX_META_BYTES = 4 * 2**20

T = TypeVar("T")

# a JSON string (escapes included); linear: the alternatives are disjoint single characters
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.S)


class InputError(ValueError):
    """A file or value that cannot be taken; the message is one line naming the file (or
    value) and the field."""


def json_depth(text: bytes | bytearray | str) -> int:
    """The deepest nesting of ``[``/``{`` in a JSON text, strings skipped; computed without
    parsing (vectorised: ~50 MB/s)."""
    raw = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else bytes(text)
    bare = np.frombuffer(_STRING.sub(b'""', raw), np.uint8)
    if not bare.size:
        return 0
    step = np.isin(bare, (ord("["), ord("{"))).astype(np.int64) - \
        np.isin(bare, (ord("]"), ord("}"))).astype(np.int64)
    return int(max(0, np.cumsum(step).max()))


def read_json(raw: bytes | bytearray | str, name: str, limit: int,
              max_depth: int = MAX_FILE_DEPTH) -> Any:
    """The decoded JSON text ``raw``; InputError (one line naming ``name``) when it is longer
    than ``limit`` bytes (characters for a str), nested deeper than ``max_depth``, not
    UTF-8 or not JSON."""
    if len(raw) > limit:
        raise InputError(f"{name}: {len(raw)} bytes, the limit is {limit}")
    if json_depth(raw) > max_depth:
        raise InputError(f"{name}: nested deeper than {max_depth} levels")
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as err:  # JSONDecodeError, UnicodeDecodeError
        raise InputError(f"{name}: not valid JSON ({_one_line(err)})") from None


def read_bytes(path: str | Path, limit: int, name: str | None = None,
               what: str = "file") -> bytes:
    """A file's bytes, its size checked before it is read; InputError (one line naming the
    file) when it is missing (``{what} not found: {path}``), not a file, unreadable or
    larger than ``limit`` bytes."""
    path = Path(path)
    name = name or str(path)
    try:
        if not path.exists():
            raise InputError(f"{what} not found: {path}")
        size = path.stat().st_size
        if not path.is_file():
            raise InputError(f"{name}: not a file")
        if size > limit:
            raise InputError(f"{name}: {size} bytes, the limit is {limit}")
        with path.open("rb") as f:
            data = f.read(limit + 1)  # a file growing meanwhile is still bounded
    except OSError as err:
        raise InputError(f"{name}: cannot be read ({err.strerror or err})") from None
    if len(data) > limit:
        raise InputError(f"{name}: larger than the limit of {limit} bytes")
    return data


def read_json_file(path: str | Path, limit: int, name: str | None = None,
                   max_depth: int = MAX_FILE_DEPTH, what: str = "file") -> Any:
    """:func:`read_json` of a file read by :func:`read_bytes`."""
    name = name or str(path)
    return read_json(read_bytes(path, limit, name, what), name, limit, max_depth)


def validate(model: type[T] | TypeAdapter, data: Any, name: str,
             context: dict[str, Any] | None = None) -> T:
    """``data`` as ``model`` (a pydantic model or a TypeAdapter); InputError ``name: field:
    message`` for the first invalid field."""
    try:
        if isinstance(model, TypeAdapter):
            return model.validate_python(data, context=context)
        assert isinstance(model, type) and issubclass(model, BaseModel)
        return model.model_validate(data, context=context)  # type: ignore[return-value]
    except ValidationError as err:
        raise InputError(first_error(err, name)) from None


def first_error(err: ValidationError, name: str) -> str:
    """One line ``name: field: message`` for a pydantic error's first problem."""
    first = err.errors(include_url=False)[0]
    where = ".".join(str(p) for p in first["loc"])
    return f"{name}: {where + ': ' if where else ''}{_one_line(first['msg'])}"


def _one_line(value: Any, width: int = 200) -> str:
    text = " ".join(str(value).split())
    return text if len(text) <= width else text[:width - 3] + "..."


# ---------------------------------------------------------------- declared bounds
@dataclass(frozen=True)
class Check:
    """A field's check beyond its type and range, declared on it
    (``Annotated[str, Check(device_problem)]``): ``problem(value)`` is None or what is wrong."""

    problem: Callable[[Any], str | None]


def field_metadata(cls: type) -> dict[str, list[Any]]:
    """Each dataclass field's declared bounds and checks (``annotated_types`` ``Ge``, ``Le``,
    ``Interval``..., :class:`Check`), found on the nearest class of the MRO that declares
    any: a subclass that only changes a default keeps its base's bounds."""
    out: dict[str, list[Any]] = {}
    for klass in cls.__mro__:
        if not dataclasses.is_dataclass(klass):
            continue
        hints = typing.get_type_hints(klass, include_extras=True)
        for name in klass.__dict__.get("__annotations__", {}):
            if name not in out or not out[name]:
                out[name] = _metadata(hints.get(name))
    return out


def _metadata(hint: Any) -> list[Any]:
    """The metadata of an ``Annotated`` hint, or of the one inside an ``X | None``."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return [m for arg in typing.get_args(hint) for m in _metadata(arg)]
    if typing.get_origin(hint) is typing.Annotated:
        found: list[Any] = []
        for item in hint.__metadata__:
            found.extend(item if isinstance(item, annotated_types.GroupedMetadata) else [item])
        return found
    return []


def value_problem(metadata: list[Any], value: Any) -> str | None:
    """What is wrong with ``value`` under a field's ``metadata`` (None: nothing; None values
    are the type's business). NaN fails every bound."""
    if value is None:
        return None
    for item in metadata:
        if isinstance(item, Check):
            problem = item.problem(value)
            if problem:
                return problem
            continue
        if not isinstance(value, int | float) or isinstance(value, bool):
            continue
        if isinstance(item, annotated_types.Ge) and not value >= typing.cast(float, item.ge):
            return f"must be >= {item.ge}, got {value!r}"
        if isinstance(item, annotated_types.Gt) and not value > typing.cast(float, item.gt):
            return f"must be > {item.gt}, got {value!r}"
        if isinstance(item, annotated_types.Le) and not value <= typing.cast(float, item.le):
            return f"must be <= {item.le}, got {value!r}"
        if isinstance(item, annotated_types.Lt) and not value < typing.cast(float, item.lt):
            return f"must be < {item.lt}, got {value!r}"
    return None


def check_declared(obj: Any) -> None:
    """Every field of dataclass ``obj`` against its declared bounds and checks; ValueError
    ``name must be ...`` for the first that fails (call from ``__post_init__``)."""
    for name, metadata in field_metadata(type(obj)).items():
        problem = value_problem(metadata, getattr(obj, name))
        if problem:
            raise ValueError(f"{name} {problem}")
