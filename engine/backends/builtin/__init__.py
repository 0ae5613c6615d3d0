"""The built-in family: a trained :class:`WorldDiT` and its autoencoder streamed over the
paged KV cache and the spatial memory, one module per stage of a chunk (``plan``, ``pages``,
``noise``, ``guidance``, ``compositing``, ``colour``, ``memory``) beside the backend that
lists them (``backend``), its settings (``config``), its per-stream state (``state``), its
loading (``load``) and its rows (``family``).

NOTE: the names below are imported on first use (PEP 562): the registry reads ``family`` at
every start, and that must not load torch (``--model sim`` never does).
"""

from __future__ import annotations

import importlib
from typing import Any

#: exported name -> the module that defines it
_EXPORTS = {
    "AFTER_DELIVERY": "worldstream.engine.backends.builtin.backend",
    "STAGES": "worldstream.engine.backends.builtin.backend",
    "BuiltinBackend": "worldstream.engine.backends.builtin.backend",
    "BuiltinConfig": "worldstream.engine.backends.builtin.config",
    "BuiltinState": "worldstream.engine.backends.builtin.state",
    "ChunkRecord": "worldstream.engine.backends.builtin.state",
    "MemoryViews": "worldstream.engine.backends.builtin.state",
    "PagedAttentionContext": "worldstream.engine.backends.paged_context",
    "builtin_config": "worldstream.engine.backends.builtin.load",
    "load_builtin_backend": "worldstream.engine.backends.builtin.load",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
