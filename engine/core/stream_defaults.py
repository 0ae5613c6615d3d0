"""The stream settings an engine derives from its config and its backend (fps, chunk sizes,
steps, rewind depth), checked against each other once, at construction; and the seed and fps a
new session asks for, checked against them."""

from __future__ import annotations

import random
from dataclasses import dataclass

from worldstream.engine.core.backend import BackendInfo, WorldBackend
from worldstream.engine.core.commands import is_int, mode_settings
from worldstream.engine.core.config import EngineConfig


@dataclass(frozen=True)
class StreamDefaults:
    """What a new session streams with unless it asks otherwise."""

    #: frames per second of a new session
    fps: int
    #: the chunk sizes (frames) the backend can generate
    chunk_sizes: tuple[int, ...]
    #: frames per chunk of a new session, one of ``chunk_sizes``
    chunk_frames: int
    #: denoising steps per chunk of a new session
    steps: int
    #: how many chunks a session may rewind
    rewind_chunks: int


def resolve_stream_defaults(backend: WorldBackend, info: BackendInfo,
                            config: EngineConfig) -> StreamDefaults:
    """Raises ValueError when the config does not fit the backend (fps, chunk size, buffer)."""
    fps = config.fps or backend.default_fps
    if not config.min_fps <= fps <= config.max_fps:
        raise ValueError(f"fps {fps} outside [{config.min_fps}, {config.max_fps}]")
    chunk_sizes = info.supported_chunk_frames
    chunk_frames = config.chunk_frames or backend.chunk_frames
    steps = config.steps
    if config.mode is not None:
        chunk_frames, steps = mode_settings(config.mode, chunk_sizes, config.min_steps)
    if chunk_frames not in chunk_sizes:
        raise ValueError(f"chunk_frames {chunk_frames} not supported by model "
                         f"{backend.name!r} (supported: {list(chunk_sizes)})")
    largest = max(chunk_sizes)
    if config.buffer_max_frames < largest + config.batch_join_frames:
        raise ValueError(f"buffer_max_frames ({config.buffer_max_frames}) must hold a chunk "
                         f"of {largest} frames plus batch_join_frames "
                         f"({config.batch_join_frames})")
    return StreamDefaults(fps, chunk_sizes, chunk_frames, steps,
                          min(config.rewind_chunks, backend.rewind_chunks))


def check_seed_and_fps(seed: int | None, fps: int | None, default_fps: int,
                       config: EngineConfig) -> tuple[int, int]:
    """A new session's seed (None: a random one) and fps (None: ``default_fps``). Raises
    ValueError for a negative or non-int seed, or an fps outside the config's bounds."""
    if seed is None:
        seed = random.randrange(2**31)
    if not is_int(seed) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    fps = default_fps if fps is None else fps
    if not is_int(fps) or not config.min_fps <= fps <= config.max_fps:
        raise ValueError(f"fps must be an int in [{config.min_fps}, "
                         f"{config.max_fps}], got {fps!r}")
    return seed, fps
