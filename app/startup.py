"""The start-up line that states the resolved configuration of a served model."""

from __future__ import annotations

from typing import Any

import torch


def startup_line(world: str, model: str, backend: Any, engine_config: Any) -> str:
    """One line: world, model family, backend, device, dtypes, torch threads, compile, the
    sessions' starting mode with its chunk frames and steps, and the session limit."""
    from worldstream.engine.core.backend import backend_info
    from worldstream.engine.core.config import MODES

    info = backend_info(backend)
    mode = MODES.get(engine_config.mode) if engine_config.mode else None
    fields = {
        "world": world,
        "model": model,
        "backend": info.name,
        "device": info.device,
        "dtype": info.dtype,
        "autoencoder_dtype": info.autoencoder_dtype,
        "threads": torch.get_num_threads(),
        "compile": info.compile,
        "mode": engine_config.mode,
        "chunk_frames": mode.chunk_frames if mode else engine_config.chunk_frames,
        "steps": mode.steps if mode else engine_config.steps,
        "max_sessions": engine_config.max_sessions,
    }
    return "worldstream: config " + " ".join(f"{k}={v}" for k, v in fields.items()
                                            if v is not None)

