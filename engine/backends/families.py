"""The shipped families, as worldstream's own ``worldstream.families`` entry point: the rows
of every family folder here that has a ``family`` module (its ``FAMILIES`` tuple), so a new
folder needs no other edit. The registry reads them exactly as it reads a plugin's."""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil

from worldstream.engine.core.family import Family

#: the package whose folders are searched
PACKAGE = "worldstream.engine.backends"
#: folders read first, in this order (the default world's families lead the ``--world`` and
#: ``--model`` choices); the others follow in name order
FIRST = ("builtin", "sim")


def families() -> list[Family]:
    """Every folder's rows, folders in :data:`FIRST`, then name order (the order of
    ``--world`` and ``--model`` choices); a ``family`` module without a ``FAMILIES`` tuple
    raises TypeError."""
    rows: list[Family] = []
    root = importlib.import_module(PACKAGE)

    def order(info: pkgutil.ModuleInfo) -> tuple[int, str]:
        return (FIRST.index(info.name) if info.name in FIRST else len(FIRST), info.name)

    for info in sorted(pkgutil.iter_modules(root.__path__), key=order):
        name = f"{PACKAGE}.{info.name}.family"
        if not info.ispkg or importlib.util.find_spec(name) is None:
            continue
        found = vars(importlib.import_module(name)).get("FAMILIES")
        if not isinstance(found, tuple):
            raise TypeError(f"{name}: expected a FAMILIES tuple of Family rows")
        rows.extend(found)
    return rows
