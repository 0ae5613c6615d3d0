"""One chunk's path as an ordered list of named stages, and the stages every family shares.

A family's backend lists its stages (``PagedRunner.stages``, then ``after_delivery``); the
runner walks them in order over one :class:`ChunkBatch`, timing each. A stage is a function
``(backend, batch) -> None`` that fills in its part of the batch; the family's own stages live
in the family's package (``engine.backends.builtin``). The shared order is::

    plan -> select_pages -> condition -> noise -> denoise -> show   | frames delivered
    cache_fill -> commit                                            | after delivery

Tests swap one stage for a spy with :func:`replace_stage`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Generic, Protocol, TypeVar

import numpy as np
import torch

from worldstream.engine.backends import cache_fill as cache_fill_ops
from worldstream.engine.backends.paged_context import PagedAttentionContext
from worldstream.engine.backends.sampler import denoise as flow_denoise
from worldstream.engine.backends.sampler import step_sigmas
from worldstream.engine.core.backend import ChunkJob


class StageRunner(Protocol):
    """What the shared stages use of the runner that walks them (``PagedRunner``: a Protocol,
    so this module never imports its owner)."""

    device: torch.device
    topk_pages: int
    #: the family's ``StreamConfig`` (``shift``, ``last_step_cache_sigma``)
    config: Any

    def attended(self, state: Any, record: Any) -> list[int]: ...

    def extra_context(self, state: Any, record: Any) -> list[int]: ...

    def attention_context(self, pages: list[list[int]], contexts: list[list[int]],
                          candidates: list[list[int]] | None = None,
                          attention: str | None = None) -> PagedAttentionContext: ...

    def conditioning(self, states: list[Any], records: list) -> Any: ...

    def noise(self, generator: torch.Generator) -> torch.Tensor: ...

    def forward(self, x: torch.Tensor, sigma: float, cond: Any,
                ctx: PagedAttentionContext) -> torch.Tensor: ...

    def to_x0(self, x: torch.Tensor, sigma: float, out: torch.Tensor) -> torch.Tensor: ...

    def returned_on_failure(self, pages: list[list[int]]
                            ) -> contextlib.AbstractContextManager[None]: ...

    def trim_history(self, state: Any) -> None: ...


#: what a family's ``plan`` leaves for its ``show`` (the built-in's ``MemoryViews``)
ViewsT = TypeVar("ViewsT")


@dataclass
class ChunkBatch(Generic[ViewsT]):
    """The chunks of one batch on their way through the stages (one row per job).

    ``pages``: each job's freshly allocated KV pages. ``records``: each chunk's record (the
    family's dataclass: ``position``, ``num_frames``, ``latents``, ``context``). ``views``:
    what the family's ``show`` needs from its ``plan``. ``cond``: the family's conditioning
    (``PagedRunner.conditioning``: text embedding, picture, actions), a tuple of tensors.
    ``contexts``/``candidates``: pages each row attends always / may pick by key similarity.
    ``noise``/``x0``: ``(B, *chunk shape)`` float32 initial noise and clean latents.
    ``frames``: each row's ``(F, H, W, 3)`` uint8.
    """

    jobs: list[ChunkJob]
    pages: list[list[int]]
    records: list = field(default_factory=list)
    views: ViewsT | None = None
    contexts: list[list[int]] = field(default_factory=list)
    candidates: list[list[int]] | None = None
    attention: PagedAttentionContext | None = None
    cond: tuple[Any, ...] | None = None
    noise: torch.Tensor | None = None
    x0: torch.Tensor | None = None
    frames: list[np.ndarray] = field(default_factory=list)

    @property
    def states(self) -> list:
        return [job.state for job in self.jobs]

    @property
    def steps(self) -> int:
        """Denoising steps of the batch (jobs are grouped by steps)."""
        return self.jobs[0].steps


@dataclass(frozen=True)
class Stage:
    """A named step of a chunk's path. ``reported_as``: the ``ChunkResult.stages_ms`` key its
    time adds to (None: not reported)."""

    name: str
    run: Callable[[Any, ChunkBatch], None]
    reported_as: str | None = None


def replace_stage(stages: tuple[Stage, ...], name: str,
                  run: Callable[[Any, ChunkBatch], None]) -> tuple[Stage, ...]:
    """``stages`` with the stage ``name`` running ``run`` instead; KeyError for an unknown
    name."""
    if name not in {s.name for s in stages}:
        raise KeyError(f"no stage {name!r} in {[s.name for s in stages]}")
    return tuple(replace(s, run=run) if s.name == name else s for s in stages)


# -- the shared stages --------------------------------------------------------------------
def select_pages(backend: StageRunner, batch: ChunkBatch) -> None:
    """Each row's attended pages (sink + window, the family's extra context), then the
    batch's attention context (:func:`attend`)."""
    attend(backend, batch, [backend.attended(s, r) + backend.extra_context(s, r)
                            for s, r in zip(batch.states, batch.records)])


def attend(backend: StageRunner, batch: ChunkBatch, contexts: list[list[int]]) -> None:
    """The batch's attention over ``contexts`` (each row's attended pages) and, with top-k
    selection, each row's older candidate pages."""
    batch.contexts = contexts
    if backend.topk_pages:
        batch.candidates = [[p for p in s.table.older_pages() if p not in c]
                            for s, c in zip(batch.states, contexts)]
    batch.attention = backend.attention_context(batch.pages, contexts, batch.candidates,
                                       batch.states[0].attention)


def condition(backend: StageRunner, batch: ChunkBatch) -> None:
    """The batch's conditioning (the family's tensors, computed once per batch)."""
    batch.cond = backend.conditioning(batch.states, batch.records)


def noise(backend: StageRunner, batch: ChunkBatch) -> None:
    """Each row's initial noise: from the job's seed, else from the state's generator."""
    batch.noise = torch.stack([
        backend.noise(torch.Generator().manual_seed(job.seed) if job.seed is not None
                      else job.state.rng)
        for job in batch.jobs]).to(backend.device)


def denoise(backend: StageRunner, batch: ChunkBatch) -> None:
    """Flow-matching denoise of the batch (every step rewrites the chunks' keys/values in
    their pages); the clean latents go to the records."""
    cond, ctx = batch.cond, batch.attention

    def predict_x0(x, sigma):
        return backend.to_x0(x, sigma, backend.forward(x, sigma, cond, ctx))

    batch.x0 = flow_denoise(predict_x0, batch.noise, batch.steps, backend.config.shift)
    keep_latents(backend, batch)


def keep_latents(backend: StageRunner, batch: ChunkBatch) -> None:
    """The denoised latents, float32 on the CPU, into each chunk's record."""
    for rec, lat in zip(batch.records, batch.x0):
        rec.latents = lat.float().cpu() if backend.device.type != "cpu" else lat.float()


def cache_fill(backend: StageRunner, batch: ChunkBatch) -> None:
    """One forward of the clean chunks at ``ctx_sigma`` into their pages, the keys/values
    later chunks attend to; skipped where the last step's are kept
    (``StreamConfig.last_step_cache_sigma``)."""
    keep = backend.config.last_step_cache_sigma
    if keep is None or step_sigmas(batch.steps, backend.config.shift)[-1] > keep + 1e-6:
        with backend.returned_on_failure(batch.pages):
            cache_fill_ops.fill(backend, batch.states, batch.records, batch.pages, batch.contexts)


def commit(backend: StageRunner, batch: ChunkBatch) -> None:
    """Append each chunk to its state: pages to the page table, record to the history (the
    oldest beyond ``memory_chunks`` dropped)."""
    for state, rec, pages in zip(batch.states, batch.records, batch.pages):
        state.table.append_chunk(pages)
        state.history.append(rec)
        backend.trim_history(state)
