"""The model runner every neural backend shares: the paged KV pool, the state lifecycle
(new, fork, free, rewind, prompt switch with recache), batching, and the walk of a chunk's
stages.

A family subclasses :class:`PagedRunner`, supplies its hooks (``_embed``, ``_make_state``,
``_fork_state``, ``conditioning``, ``forward``, ``noise``; optionally ``to_x0``,
``attended``, ``extra_context``, ``_prefill``, ``_on_prompt``, ``_undo_extra``) and lists
its chunk path as named stages (:mod:`engine.backends.stages`): ``stages`` run before the
frames are delivered, ``after_delivery`` (the cache fill and the commit) when the engine
calls :meth:`PagedRunner.finish`, off the action-to-photon path. All public methods take one
lock: the engine thread generates while other threads fork or free.

The services a stage calls are public and typed: ``attended``, ``extra_context``,
``attention_context``, ``conditioning``, ``noise``, ``forward``, ``to_x0``,
``returned_on_failure``, ``trim_history``, ``settled``, ``live`` (a family adds its own:
the built-in's ``base_cache``, ``exclude``, ``scratch_pages``).
"""

from __future__ import annotations

import contextlib
import threading
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from worldstream import kernels
from worldstream.engine.backends import cache_fill
from worldstream.engine.backends import stages as shared
from worldstream.engine.backends.paged_context import PagedAttentionContext
from worldstream.engine.backends.sampler import fork_rng
from worldstream.engine.backends.stages import ChunkBatch, Stage
from worldstream.engine.backends.stream_config import StreamConfig
from worldstream.engine.core.api import CapacityError
from worldstream.engine.core.backend import BackendInfo, ChunkJob, ChunkResult, dtype_name
from worldstream.engine.core.kv_cache import PageAllocator, PageTable, allocate_chunks
from worldstream.engine.core.limits import MAX_STEPS


@dataclass
class RunnerState:
    """One session's (or branch's) model state: its page table, prompt, conditioning
    (``text``), noise generator and retained chunk records (newest last). Families subclass it
    with what they keep beside the KV cache."""

    table: PageTable
    prompt: str
    text: torch.Tensor
    rng: torch.Generator
    history: deque = field(default_factory=deque)
    needs_recache: bool = False
    freed: bool = False
    attention: str | None = None  # this state's attention kernel (None: the runner's)

    @property
    def position(self) -> int:
        """Time index (latent frames) of the next chunk's first frame."""
        if not self.history:
            return 0
        last = self.history[-1]
        return last.position + last.num_frames


class PagedRunner(ABC):
    """Base of the neural backends (``engine.core.backend.WorldBackend``); see the module
    docstring for what a family supplies.

    Args:
        config: the family's :class:`StreamConfig` (subclass).
        pages_per_chunk: KV pages (latent frames) one chunk occupies.
        pool_shape: ``(layers, heads, page_size, head_dim)`` of the KV pool.
        dtype, device: the pool's dtype and device.
        topk_pages: older pages attended per query chunk by key similarity (0 = off).
    """

    #: the chunk's path up to its frames, in order (:mod:`engine.backends.stages`)
    stages: tuple[Stage, ...] = ()
    #: the chunk's path after its frames were delivered: the cache fill, then the commit
    after_delivery: tuple[Stage, ...] = (Stage("cache_fill", shared.cache_fill),
                                         Stage("commit", shared.commit))
    #: negative forwards a family's guided step may batch beside its conditional one
    #: (``paged_context.batched_forwards``); the pool keeps scratch pages for them
    negative_forwards: int = 0
    #: the backend id (set by the family: a class attribute, or per variant)
    name: str
    #: frames one chunk decodes to (set by the family)
    chunk_frames: int

    def __init__(
        self,
        config: StreamConfig,
        pages_per_chunk: int,
        pool_shape: tuple[int, int, int, int],
        dtype: torch.dtype,
        device: torch.device,
        topk_pages: int = 0,
    ):
        self.config = config
        self.device = device
        self.pages_per_chunk = pages_per_chunk
        self.topk_pages = topk_pages
        self.max_states = config.max_states
        self.rewind_chunks = config.memory_chunks - config.window_chunks
        layers, heads, page_size, head_dim = pool_shape
        num_pages = config.pages_per_state(pages_per_chunk) * config.max_states
        self.allocator = PageAllocator(num_pages)
        # the pool's last pages, never handed out: where the negative rows of a batched guided
        # forward write the keys/values nobody reads after it (PagedAttentionContext.
        # with_negatives)
        scratch = self.negative_forwards * pages_per_chunk * config.max_states
        self.scratch_pages = list(range(num_pages, num_pages + scratch))
        shape = (layers, num_pages + scratch, heads, page_size, head_dim)
        self.k_pool = torch.zeros(shape, dtype=dtype, device=device)
        self.v_pool = torch.zeros(shape, dtype=dtype, device=device)
        self.attention_backend = kernels.resolve_backend(config.attention_backend, device)
        self._lock = threading.RLock()
        # the cache fill and commits of the last generate(), run by finish() after the frames
        # were delivered (off the action-to-photon path) or before any other call
        self._deferred: list[Callable[[], None]] = []

    def runner_info(self, **facts: Any) -> BackendInfo:
        """A family's :class:`BackendInfo` (its ``info()``): ``facts`` (world, chunk sizes,
        keys, ...) with this runner's name, chunk size, device and dtype."""
        return BackendInfo(name=self.name, chunk_frames=self.chunk_frames,
                           device=str(self.device), dtype=dtype_name(self.config.dtype),
                           **facts)

    def world_frames(self, state: RunnerState) -> int | None:
        """The stream's position (``engine.core.backend.CountsWorldFrames``); None before its
        first chunk."""
        return state.position if state.history else None

    # -- what a family supplies ---------------------------------------------------------
    @abstractmethod
    def _embed(self, text: str, blend_text: str | None, weight: float) -> torch.Tensor:
        """The prompt's (optionally blended) conditioning tensor; ValueError for a bad prompt."""

    @abstractmethod
    def _make_state(self, table: PageTable, prompt: str, text: torch.Tensor,
                    rng: torch.Generator, **kwargs: Any) -> RunnerState:
        """A fresh family state over ``table`` (``kwargs``: e.g. start frames)."""

    @abstractmethod
    def _fork_state(self, state: RunnerState, table: PageTable,
                    rng: torch.Generator) -> RunnerState:
        """A copy of ``state`` over the forked ``table`` with its own ``rng``."""

    def _validate_job(self, job: ChunkJob) -> None:
        """Family checks of one job (action ids, ...); ValueError."""
        return None  # optional hook: nothing by default

    def _prefill(self, state: RunnerState) -> None:
        """Cache-fill the state's start frames, if it has any pending."""
        return None  # optional hook: nothing by default

    def _on_prompt(self, state: RunnerState, blend_text: str | None, blend_weight: float
                   ) -> None:
        """Family bookkeeping of a prompt switch to ``state.prompt`` (blended with
        ``blend_text`` at ``blend_weight``), called under the lock."""
        return None  # optional hook: nothing by default

    @abstractmethod
    def conditioning(self, states: list[RunnerState], records: list) -> Any:
        """The conditioning of one forward of ``records`` (computed once per batch)."""

    @abstractmethod
    def forward(self, x: torch.Tensor, sigma: float, cond: Any,
                 ctx: PagedAttentionContext) -> torch.Tensor:
        """One forward of chunks ``x`` at noise ``sigma``; writes their keys/values through
        ``ctx``."""

    def to_x0(self, x: torch.Tensor, sigma: float, out: torch.Tensor) -> torch.Tensor:
        """The clean-latent prediction from the model output (x0-parameterised by default)."""
        return out

    @abstractmethod
    def noise(self, generator: torch.Generator) -> torch.Tensor:
        """Standard normal noise of one chunk drawn from ``generator``."""

    def step_cost(self, steps: int) -> int:
        """Forwards between a chunk's actions and its frames at ``steps`` denoising steps (the
        engine's degradation skips step counts no cheaper than the one above); the cache
        fill runs after delivery and is not counted."""
        return steps - int(self._first_step_skipped(steps))

    def _first_step_skipped(self, steps: int) -> bool:
        """Whether a typical chunk of ``steps`` steps runs without its first forward."""
        return False

    def _undo_extra(self, state: RunnerState, record: Any) -> None:
        """Undo what the family keeps beside the KV cache for a rewound chunk."""
        return None  # optional hook: nothing by default

    def _after_rewind(self, state: RunnerState) -> None:
        """Rebuild what cannot be undone chunk by chunk, after a rewind."""
        return None  # optional hook: nothing by default

    # -- locking and deferred work ------------------------------------------------------
    @contextlib.contextmanager
    def settled(self):
        """The runner's lock, taken with the deferred work of the last generate() done
        first, so every call sees committed states."""
        with self._lock:
            self._run_deferred()
            yield

    @torch.no_grad()
    def _run_deferred(self) -> None:
        # NOTE: no_grad here, not only in generate(): the deferred cache fill runs later, from
        # finish() or any other call, and with autograd on every fill would chain a graph onto
        # the page pool that is never freed
        deferred, self._deferred = self._deferred, []
        for work in deferred:
            work()

    def finish(self) -> dict[str, float]:
        """Run the work :meth:`generate` left for after delivery: each chunk's cache fill
        (none where its last step's keys/values are kept: ``last_step_cache_sigma``),
        page-table append and the family's commit. Returns ``{"cache_fill": ms}``. The engine
        calls it once the frames are on their way; any other call runs it first, so calling
        it is optional."""
        t0 = time.perf_counter()
        with self._lock:
            self._run_deferred()
        return {"cache_fill": (time.perf_counter() - t0) * 1e3}

    # -- state lifecycle ----------------------------------------------------------------
    def prepare_prompt(self, text: str, blend_text: str | None = None,
                       blend_weight: float = 0.0) -> None:
        """Encode a prompt ahead (the engine calls it off its thread) so that
        :meth:`set_prompt` is a cache lookup. ValueError for a bad prompt or weight."""
        self._embed(text, blend_text, blend_weight)

    def new_state(self, prompt: str, seed: int, **kwargs: Any) -> RunnerState:
        """A stream of ``prompt`` whose noise follows ``seed``; ``kwargs`` go to the family
        (e.g. start frames). ValueError for a bad prompt. Pages are taken chunk by chunk, so a
        full pool shows as a chunk's ``CapacityError``."""
        text = self._embed(prompt, None, 0.0)
        with self.settled():
            cfg = self.config
            table = PageTable(self.allocator, pages_per_chunk=self.pages_per_chunk,
                              window_chunks=cfg.window_chunks, sink=cfg.sink,
                              max_chunks=cfg.memory_chunks)
            return self._make_state(table, prompt, text, torch.Generator().manual_seed(seed),
                                    **kwargs)

    def set_prompt(self, state: RunnerState, text: str, blend_text: str | None = None,
                   blend_weight: float = 0.0) -> None:
        """Switch the prompt (optionally blended) from the next chunk on; the window is
        recached under it first. ValueError for a bad prompt or weight, nothing changed."""
        emb = self._embed(text, blend_text, blend_weight)
        with self.settled():
            state.prompt, state.text = text, emb
            state.needs_recache = self.config.recache and bool(state.history)
            self._on_prompt(state, blend_text, blend_weight)

    def fork(self, state: RunnerState) -> RunnerState:
        """A copy-on-write copy of ``state`` (shared pages, its own noise generator)."""
        with self.settled():
            return self._fork_state(state, state.table.fork(), fork_rng(state.rng))

    def free(self, state: RunnerState) -> None:
        """Release the state's pages. Idempotent."""
        with self.settled():
            if not state.freed:
                state.table.free()
                state.freed = True

    def configure(self, state: RunnerState, memory_frames: int | None = None,
                  attention: str | None = None) -> None:
        """A session's model settings (the protocol's ``settings`` message).

        ``memory_frames``: frames of past context its chunks attend besides their own, rounded
        up to whole chunks, from one chunk up to the model's window (``window_chunks``; the KV
        pool is sized for it). ``attention``: the paged-attention kernel backend of its chunks
        (``kernels.available_backends``; ``auto`` = the runner's). ValueError, nothing
        changed, for a value outside those.
        """
        with self.settled():
            chunks = backend = None
            if memory_frames is not None:
                chunks = -(-memory_frames // self.chunk_frames)
                most = self.config.window_chunks * self.chunk_frames
                if not isinstance(memory_frames, int) or not 1 <= chunks <= (
                    self.config.window_chunks
                ):
                    raise ValueError(f"memory_frames must be in [1, {most}] for this model, "
                                     f"got {memory_frames!r}")
            if attention is not None:
                backend = (self.attention_backend if attention == "auto"
                           else kernels.resolve_backend(attention, self.device))
            if chunks is not None:
                state.table.window_chunks = chunks
            if backend is not None:
                state.attention = backend

    def rewind(self, state: RunnerState, chunks: int) -> None:
        """Drop the newest ``chunks`` chunks: their pages and what the family kept of them.
        ValueError, with nothing changed, beyond the retained history (the first chunk stays)."""
        with self.settled():
            limit = max(min(len(state.history) - 1, state.table.max_rewind()), 0)
            if isinstance(chunks, bool) or not isinstance(chunks, int) or not (
                0 <= chunks <= limit
            ):
                raise ValueError(f"cannot rewind {chunks!r} chunks; {limit} are kept")
            state.table.rewind(chunks)
            for _ in range(chunks):
                self._undo_extra(state, state.history.pop())
            self._after_rewind(state)

    # -- generation ---------------------------------------------------------------------
    @torch.no_grad()
    def generate(self, jobs: list[ChunkJob]) -> list[ChunkResult]:
        """One chunk per job; jobs are batched by (frames, steps, attention kernel), or each
        run on its own with ``batch_invariant``. Per-job
        failures (pool exhausted, bad actions, freed state) come back as ``ChunkResult.error`` and
        leave the other jobs' results valid."""
        results: list[ChunkResult | None] = [None] * len(jobs)
        with self.settled():
            groups: dict[tuple[int, int, str | None, int], list[int]] = {}
            for i, job in enumerate(jobs):
                try:
                    self._validate(job)
                    self._prefill(job.state)
                    if job.state.needs_recache:
                        cache_fill.recache(self, job.state)
                    key = (job.num_frames, job.steps, job.state.attention,
                           i if self.config.batch_invariant else -1)
                    groups.setdefault(key, []).append(i)
                except Exception as err:  # isolate this job's failure
                    results[i] = ChunkResult(None, error=err)
            for idx in groups.values():
                for i, res in zip(idx, self._generate_group([jobs[i] for i in idx])):
                    results[i] = res
        return results

    def _validate(self, job: ChunkJob) -> None:
        if job.state.freed:
            raise ValueError("state was freed")
        if job.num_frames != self.chunk_frames:
            raise ValueError(
                f"this model generates chunks of {self.chunk_frames} frames, got {job.num_frames}"
            )
        if not 1 <= job.steps <= MAX_STEPS:
            raise ValueError(f"steps must be in [1, {MAX_STEPS}], got {job.steps}")
        self._validate_job(job)

    def attention_context(self, pages: list[list[int]], contexts: list[list[int]],
                 candidates: list[list[int]] | None = None,
                 attention: str | None = None) -> PagedAttentionContext:
        new = torch.tensor([p for ps in pages for p in ps], device=self.device)
        always = [c + p for c, p in zip(contexts, pages)]
        return PagedAttentionContext(self.k_pool, self.v_pool, new, always,
                                     candidates or [[] for _ in pages], self.topk_pages,
                                     attention or self.attention_backend)

    def attended(self, state: RunnerState, record: Any) -> list[int]:
        """The pages a new chunk attends besides its own and the extra context: sink and
        window (a family may leave some out)."""
        return state.table.attended_pages()

    def extra_context(self, state: RunnerState, record: Any) -> list[int]:
        """Older pages a family brings back into the attention context (default none)."""
        return []

    def trim_history(self, state: RunnerState) -> None:
        while len(state.history) > self.config.memory_chunks + (1 if self.config.sink else 0):
            state.history.popleft()

    def _generate_group(self, jobs: list[ChunkJob]) -> list[ChunkResult]:
        live, pages = allocate_chunks(self.allocator, len(jobs), self.pages_per_chunk)
        short = CapacityError("KV page pool exhausted", cache_fill.POOL_RETRY_S)
        results: list[ChunkResult | None] = [
            None if i in live else ChunkResult(None, error=short) for i in range(len(jobs))
        ]
        if not live:
            return results
        with self.returned_on_failure(pages):
            return self._generate_live(jobs, live, pages, results)

    @contextlib.contextmanager
    def returned_on_failure(self, pages: list[list[int]]):
        """Give freshly allocated ``pages`` back to the pool when the block raises (a failed
        forward must not leak them: the pool is shared by every session)."""
        try:
            yield
        except BaseException:
            self.allocator.decref([p for chunk in pages for p in chunk])
            raise

    def _generate_live(self, jobs: list[ChunkJob], live: list[int], pages: list[list[int]],
                       results: list[ChunkResult | None]) -> list[ChunkResult]:
        """The batch's chunk for the jobs ``live`` that got ``pages``: :attr:`stages` in
        order, each timed into its ``reported_as`` key; :attr:`after_delivery` is left to
        :meth:`finish`."""
        batch = ChunkBatch([jobs[i] for i in live], pages)
        stages_ms: dict[str, float] = {}
        for stage in self.stages:
            t0 = time.perf_counter()
            stage.run(self, batch)
            if stage.reported_as is not None:
                ms = (time.perf_counter() - t0) * 1e3
                stages_ms[stage.reported_as] = stages_ms.get(stage.reported_as, 0.0) + ms

        def after_delivery() -> None:  # deferred: see finish()
            for stage in self.after_delivery:
                stage.run(self, batch)

        self._deferred.append(after_delivery)
        for n, i in enumerate(live):
            results[i] = ChunkResult(batch.frames[n], dict(stages_ms))
        return results
