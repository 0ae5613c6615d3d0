"""How a state's fields are saved as arrays, declared on the fields themselves, and the check
of a save point's arrays derived from those declarations (no list kept by hand beside them).

A family annotates its state's array fields (``Annotated[torch.Tensor, Saved(("F", "C", "S",
"S"), "<f4")]``); :func:`saved_arrays` collects them under the names the family's export
writes (``h*.latents``: ``*`` stands for an index), and :func:`layout_problem` checks a save
file's layout (name -> (dtype, shape), read from its header before any array is decoded)
against them, with the model's sizes for the symbols. No torch here.
"""

from __future__ import annotations

import dataclasses
import re
import typing
from dataclasses import dataclass
from typing import Any

import numpy as np

#: safetensors' dtype names -> numpy's (a layout may also give numpy's own names)
SAFETENSORS_DTYPES = {name: np.dtype(code) for name, code in {
    "BOOL": "?", "U8": "u1", "I8": "i1", "U16": "<u2", "I16": "<i2", "F16": "<f2",
    "U32": "<u4", "I32": "<i4", "F32": "<f4", "U64": "<u8", "I64": "<i8", "F64": "<f8"}.items()}

_INDEX = re.compile(r"^([a-z]?)\d+$")


@dataclass(frozen=True)
class Saved:
    """A field saved as an array: its numpy ``dtype`` and ``shape``, each dimension an int, a
    symbol the family resolves from its model (``"F"`` frames per chunk, ``"C"`` latent
    channels...), or ``"*"``: a count, bounded by the family's scalar checks. ``name``: the
    array's name when it is not the field's (one field saved as two arrays)."""

    shape: tuple[int | str, ...]
    dtype: str
    name: str | None = None
    #: the largest magnitude a value may have (None: the dtype's own range); a float array's
    #: values are finite whatever this says
    limit: float | None = None

    def counted(self) -> Saved:
        """The same array stacked: a count first (``mem.rgb``: the tiles)."""
        return dataclasses.replace(self, shape=("*", *self.shape))

    def loose(self, symbol: str) -> Saved:
        """The same array with ``symbol``'s dimensions any size (a part of a tile)."""
        return dataclasses.replace(self, shape=tuple("*" if d == symbol else d
                                                     for d in self.shape))


def saved_arrays(cls: type, prefix: str = "") -> dict[str, Saved]:
    """``{prefix + array name: Saved}`` of each field of dataclass ``cls`` that declares one
    (or several: ``Annotated[..., Saved(..., name="cam_pos"), Saved(..., name="cam_vel")]``)."""
    hints = typing.get_type_hints(cls, include_extras=True)
    out = {}
    for f in dataclasses.fields(cls):
        for item in _metadata(hints[f.name]):
            if isinstance(item, Saved):
                out[prefix + (item.name or f.name)] = item
    return out


def _metadata(hint: Any) -> list[Any]:
    if typing.get_origin(hint) is typing.Annotated:
        return list(hint.__metadata__)
    # ``Annotated[...] | None``
    return [m for arg in typing.get_args(hint) if typing.get_origin(arg) is typing.Annotated
            for m in arg.__metadata__]


def pattern(name: str) -> str:
    """An array's name with its indices as ``*``: ``h12.u3.0.rgb`` -> ``h*.u*.*.rgb``."""
    return ".".join(_INDEX.sub(r"\1*", part) for part in name.split("."))


def _dtype(name: str) -> np.dtype | None:
    try:
        return SAFETENSORS_DTYPES.get(name) or np.dtype(name)
    except TypeError:
        return None


def layout_problem(layout: dict[str, tuple[str, tuple[int, ...]]],
                   declared: dict[str, Saved], sizes: dict[str, int]) -> str | None:
    """What is wrong with a save file's arrays (``layout``: name -> (dtype, shape)) against
    the ``declared`` arrays of a state (:func:`saved_arrays`), its symbols resolved by
    ``sizes``; None when each array is declared, of its dtype and shape. An empty array of
    a counted kind (no memory tiles) passes whatever its shape."""
    for name, (dtype, shape) in layout.items():
        spec = declared.get(pattern(name))
        if spec is None:
            return f"array {name[:60]!r} is not part of this model's state"
        shape = tuple(int(n) for n in shape)
        if spec.shape[:1] == ("*",) and shape[:1] == (0,):
            continue
        if _dtype(dtype) != np.dtype(spec.dtype):
            return f"array {name} is {dtype}; this model's is {np.dtype(spec.dtype).name}"
        want = tuple(sizes[d] if isinstance(d, str) and d != "*" else d for d in spec.shape)
        if len(shape) != len(want) or any(w != "*" and s != w for s, w in zip(shape, want)):
            shown = "(" + ", ".join(str(w) for w in want) + ")"
            return f"array {name} has shape {shape}; this model's is {shown}"
    return None


def values_problem(arrays: dict[str, np.ndarray], declared: dict[str, Saved]) -> str | None:
    """What is wrong with the values of a save file's arrays: a declared ``limit`` exceeded;
    None when nothing is."""
    for name, array in arrays.items():
        spec = declared.get(pattern(name))
        if spec is None or spec.limit is None or not array.size:
            continue
        if array.dtype.kind in "iuf" and float(np.abs(array).max()) > spec.limit:
            return f"array {name} holds values beyond +-{spec.limit:g}"
    return None


def nonfinite_array(arrays: dict[str, np.ndarray]) -> str | None:
    """The name of the first floating-point array holding a NaN or an infinity, or None."""
    for name, array in arrays.items():
        if array.dtype.kind in "fc" and array.size and not np.isfinite(array).all():
            return name
    return None
