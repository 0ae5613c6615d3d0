"""The streaming settings every neural backend shares, one documented line per field.

Each family's config subclasses :class:`StreamConfig`; each world's values are data beside its
weights (``assets/<world>/stream_config.json``, :mod:`engine.backends.settings`). Why a value
is what it is lives in the world's model card, not here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from annotated_types import Interval

from worldstream.engine.core.reader import check_declared

#: the most chunks a stream may retain (each costs KV pages in every state's budget)
MAX_MEMORY_CHUNKS = 256


@dataclass
class StreamConfig:
    """Streaming settings every neural backend shares (cross-field checks in
    :meth:`__post_init__`)."""

    window_chunks: Annotated[int, Interval(ge=1, le=64)] = 4
    """Chunks always attended besides the current one (the recency window), >= 1."""
    sink: bool = False
    """Keep the stream's first chunk attended for the whole stream (the attention sink)."""
    memory_chunks: Annotated[int, Interval(ge=1, le=MAX_MEMORY_CHUNKS)] = 12
    """Chunks retained (>= window_chunks, <= 256): sparse-memory candidates and rewind
    history."""
    ctx_sigma: Annotated[float, Interval(ge=0.0, lt=1.0)] = 0.05
    """Noise level in [0, 1) the cache fill labels the context with."""
    ctx_noise: bool = True
    """Also add real noise at ctx_sigma to the context (context augmentation)."""
    shift: Annotated[float, Interval(gt=0.0, le=100.0)] = 1.0
    """Timestep shift of the flow-matching sampler (> 0)."""
    last_step_cache_sigma: Annotated[float, Interval(ge=0.0, lt=1.0)] | None = None
    """Keep the last denoising step's keys/values as the cache entry when its σ is at most
    this, skipping the cache fill's forward; in [0, 1) or None (always fill)."""
    max_states: Annotated[int, Interval(ge=1, le=256)] = 16
    """Sessions plus fork branches the KV page pool is sized for, >= 1."""
    recache: bool = True
    """Recompute the window's keys/values under a new prompt (a prompt switch)."""
    attention_backend: str = "auto"
    """Paged-attention kernel backend (``kernels.available_backends``, or auto)."""
    batched_guidance: bool = True
    """Run a guided step's negative forwards in one batch with its conditional forward."""
    batch_invariant: bool = True
    """Generate each job of a batch on its own, so frames never depend on batch-mates
    (exact replay)."""

    def __post_init__(self):
        check_declared(self)  # each field's declared range (and check), then across fields
        if self.window_chunks < 1 or self.memory_chunks < self.window_chunks:
            raise ValueError("need 1 <= window_chunks <= memory_chunks")
        if not 0.0 <= self.ctx_sigma < 1.0:
            raise ValueError(f"ctx_sigma must be in [0, 1), got {self.ctx_sigma}")
        if self.max_states < 1:
            raise ValueError(f"max_states must be >= 1, got {self.max_states}")
        if self.last_step_cache_sigma is not None and not 0 <= self.last_step_cache_sigma < 1:
            raise ValueError("last_step_cache_sigma must be in [0, 1) or None, got "
                             f"{self.last_step_cache_sigma}")

    def pages_per_state(self, pages_per_chunk: int) -> int:
        """KV pages one state may hold: sink + retained chunks + the chunk being generated +
        a recache copy of the window."""
        return pages_per_chunk * (
            (1 if self.sink else 0) + self.memory_chunks + 1 + self.window_chunks
        )
