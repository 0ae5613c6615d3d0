"""The start-up line that states the resolved configuration of a served model."""

from __future__ import annotations

from typing import Any

import torch


def startup_line(world: str, model: str, backend: Any, engine_config: Any) -> str:
    """One line: world, model family, backend, device, dtypes, torch threads, compile, the
    sessions' starting mode with its chunk frames and steps, and the session limit."""
    from worldstream.engine.core.config import MODES

    inner = getattr(backend, "builtin", backend)  # the avatar wraps a built-in backend
    cfg = getattr(inner, "config", None)
    mode = MODES.get(engine_config.mode) if engine_config.mode else None
    fields = {
        "world": world,
        "model": model,
        "backend": getattr(backend, "name", type(backend).__name__),
        "device": str(getattr(inner, "device", "cpu")),
        "dtype": _name(getattr(cfg, "dtype", None)),
        "autoencoder_dtype": _name(getattr(inner, "ae_dtype", None)),
        "threads": torch.get_num_threads(),
        "compile": getattr(cfg, "compile", None),
        "mode": engine_config.mode,
        "chunk_frames": mode.chunk_frames if mode else engine_config.chunk_frames,
        "steps": mode.steps if mode else engine_config.steps,
        "max_sessions": engine_config.max_sessions,
    }
    return "worldstream: config " + " ".join(f"{k}={v}" for k, v in fields.items()
                                            if v is not None)


def _name(dtype: Any) -> str | None:
    return None if dtype is None else str(dtype).removeprefix("torch.")
