"""Stream settings as data: a world's ``stream_config.json`` beside its weights, overrides as
``field=value`` (``--set``), and the fields' one-line docs (``--set help``), all read
from the config dataclass itself so that nothing is written twice.

Errors are one-line ValueErrors naming the field.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
import math
import textwrap
import types
import typing
from pathlib import Path
from typing import Any

import torch

from worldstream.engine.core.reader import field_metadata, json_depth, read_json_file, value_problem

#: the file beside a world's weights that holds its stream settings
SETTINGS_FILE = "stream_config.json"
#: the commit that last had the code of retired settings (the model cards' experiments tables)
RETIRED_AT = "60fcd8b"
#: settings of experiments that did not ship, with the value that meant "off"
RETIRED = {"decode_refining": False, "world_noise_period": 0, "world_noise_hold": 64}

#: the largest settings file (or ``--set`` value) read, and the deepest value (a colour
#: prior's table is the deepest setting: 3)
_MAX_SETTINGS_BYTES = 256 * 2**10
_MAX_VALUE_DEPTH = 4

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def field_docs(cls: type) -> dict[str, str]:
    """Each dataclass field's docstring (the string literal under it; a subclass's override
    without one keeps the base class's); a field without any maps to ""."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        body = ast.parse(textwrap.dedent(inspect.getsource(klass))).body[0].body
        for node, after in zip(body, body[1:] + [None]):
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                if isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant):
                    docs[node.target.id] = " ".join(str(after.value.value).split())
                else:  # an override without a doc of its own keeps its base class's
                    docs.setdefault(node.target.id, "")
    return {f.name: docs.get(f.name, "") for f in dataclasses.fields(cls)}


def coerce(cls: type, name: str, value: Any) -> Any:
    """``value`` (JSON-like: numbers, strings, lists, null) as the type of field ``name`` of
    ``cls``; ValueError naming the field for an unknown field or a value of another type."""
    hints = typing.get_type_hints(cls)
    if name not in {f.name for f in dataclasses.fields(cls)}:
        raise ValueError(f"unknown setting {name!r}; `--set help` lists them")
    try:
        value = _coerce(hints[name], value)
    except (TypeError, ValueError, RecursionError) as err:
        raise ValueError(f"setting {name}: {' '.join(str(err).split())[:200]}") from None
    problem = value_problem(field_metadata(cls)[name], value)  # the field's declared range
    if problem:
        raise ValueError(f"setting {name} {problem}")
    return value


def _coerce(hint: Any, value: Any) -> Any:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(arg, value)
            except (TypeError, ValueError) as err:
                errors.append(str(err))
        raise ValueError("; ".join(errors))
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise ValueError(f"expected a list, got {value!r}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_coerce(args[0], v) for v in value)
        if len(value) != len(args):
            raise ValueError(f"expected {len(args)} values, got {value!r}")
        return tuple(_coerce(a, v) for a, v in zip(args, value))
    if hint is bool:
        if not isinstance(value, bool):
            raise ValueError(f"expected true or false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"expected an integer, got {value!r}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, int | float) or \
                not math.isfinite(value):
            raise ValueError(f"expected a finite number, got {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ValueError(f"expected a string, got {value!r}")
        return value
    if hint is torch.dtype:
        if value not in _DTYPES:
            raise ValueError(f"expected one of {sorted(_DTYPES)}, got {value!r}")
        return _DTYPES[value]
    raise ValueError(f"cannot be set from text ({hint})")


def drop_retired(values: dict[str, Any], where: str) -> dict[str, Any]:
    """``values`` without retired settings at their "off" value; ValueError naming the first
    retired setting asked at another value."""
    out = dict(values)
    for name, off in RETIRED.items():
        if name in out:
            if out.pop(name) != off:
                raise ValueError(f"{where}: setting {name} was retired (its code last at "
                                 f"{RETIRED_AT}); only {json.dumps(off)} loads")
    return out


def load_settings(cls: type, folder: Path) -> dict[str, Any]:
    """The settings of ``folder/stream_config.json`` as ``cls`` field values ({} without the
    file); ValueError naming the file and the field for a bad one."""
    path = Path(folder) / SETTINGS_FILE
    if not path.is_file():
        return {}
    raw = read_json_file(path, _MAX_SETTINGS_BYTES)
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: expected an object of settings")
    try:
        raw = drop_retired(raw, str(path))
        return {name: coerce(cls, name, value) for name, value in raw.items()}
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from None


def parse_overrides(cls: type, items: list[str]) -> dict[str, Any]:
    """``--set field=value`` items as ``cls`` field values; the value is read as JSON (true,
    null, 0.5, [32, 80]) and otherwise taken as text. ValueError naming the item."""
    out: dict[str, Any] = {}
    for item in items:
        name, sep, text = item.partition("=")
        if not sep or not name:
            raise ValueError(f"--set expects field=value, got {item!r}")
        if json_depth(text) > _MAX_VALUE_DEPTH or len(text) > _MAX_SETTINGS_BYTES:
            raise ValueError(f"--set {name.strip()[:60]}: the value is nested deeper than "
                             f"{_MAX_VALUE_DEPTH} levels or longer than "
                             f"{_MAX_SETTINGS_BYTES} bytes")
        try:
            value = json.loads(text)
        except ValueError:
            value = text
        out.update(drop_retired({name.strip(): value}, "--set"))
        if name.strip() in out:
            out[name.strip()] = coerce(cls, name.strip(), out[name.strip()])
    return out


def describe(cls: type, values: dict[str, Any] | None = None) -> str:
    """One line per settable field of ``cls``: name, type, value (``values``, else the
    default) and its doc."""
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    lines = []
    for f in dataclasses.fields(cls):
        default = (values or {}).get(f.name, f.default)
        if default is dataclasses.MISSING:
            default = "(required)"
        kind = getattr(hints[f.name], "__name__", str(hints[f.name]).replace("typing.", ""))
        lines.append(f"{f.name} ({kind}) = {_show(default)}\n    {docs[f.name]}")
    return "\n".join(lines)


def _show(value: Any) -> str:
    if isinstance(value, torch.dtype):
        return str(value).removeprefix("torch.")
    if dataclasses.is_dataclass(value):
        return type(value).__name__
    return json.dumps(value) if isinstance(value, bool | int | float | str | type(None)) \
        else str(value)
