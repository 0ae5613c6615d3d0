"""The model runner every neural backend shares: the paged KV pool, the state lifecycle
(new, fork, free, rewind), batching, the denoise loop, cache fill, recache and timing.

A model family subclasses :class:`PagedRunner` and supplies only what differs between models
(the pattern of vLLM's model runner under one scheduler; nano-vllm's ``model_runner.py``):

* ``_embed(text, blend_text, weight)``: the prompt's conditioning tensor;
* ``_plan(states, actions)``: each state's next chunk as a record (anything with
  ``position``, ``num_frames``, ``latents`` and ``context`` attributes) from its per-frame
  action ids, plus whatever the family's forward and display need;
* ``_conditioning(states, records)`` and ``_forward(x, sigma, cond, ctx)``: one forward of a
  batch of chunks at noise level ``sigma`` over a :class:`PagedAttentionContext`, and
  ``_to_x0`` to turn its output into a clean-latent prediction (x0- or flow-parameterised);
* ``_show(states, records, x0, plan)``: the chunk's frames; ``_commit_extra`` /
  ``_undo_extra``: what the family keeps beside the KV cache (a spatial memory, a decoder's
  causal cache) when a chunk is committed or rewound;
* optionally ``_prefill(state)``: start frames cache-filled before the first chunk, and
  ``_first_x0``: a guess that stands in for the first denoising step's forward.

Generating a batch: group jobs by (frames, steps); allocate each chunk's pages (a shortage is
a per-job ``CapacityError``); plan; denoise in 1-4 flow-matching steps (``sampler.denoise``),
every step rewriting the chunk's keys/values in its own pages; show; then, deferred until the
engine calls :meth:`PagedRunner.finish` after delivery (off the action-to-photon path), the
cache fill: one more forward of the clean chunk labelled with ``ctx_sigma`` writes the
keys/values later chunks attend to (Self-Forcing / CausVid). A prompt switch recaches the
window under the new conditioning into fresh pages (LongLive), copy-on-write so that a fork
sharing the old pages keeps them. All public methods take one lock: the engine thread
generates while other threads fork or free.
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

import numpy as np
import torch

from worldstream import kernels
from worldstream.engine.backends.sampler import denoise, fork_rng, step_sigmas
from worldstream.engine.core.api import CapacityError
from worldstream.engine.core.backend import ChunkJob, ChunkResult
from worldstream.engine.core.kv_cache import PageAllocator, PageTable, allocate_chunks
from worldstream.engine.core.limits import MAX_STEPS

#: seconds a client is told to wait when the KV page pool is exhausted
_POOL_RETRY_S = 2.0


@dataclass
class StreamConfig:
    """Streaming settings every neural backend shares.

    ``window_chunks``: chunks always attended besides the current one (W). ``sink``: keep the
    first chunk attended for the whole stream (LongLive's attention sink). ``memory_chunks``:
    chunks retained (>= W; the extra ones are sparse-memory candidates and rewind history).
    ``ctx_sigma``: noise level the cache fill labels the context with (Diffusion Forcing);
    ``ctx_noise``: also add real noise at that level (GameNGen/DIAMOND context augmentation).
    ``shift``: timestep shift of the flow-match sampler (``sampler.step_sigmas``).
    ``last_step_cache_sigma``: when a chunk's last denoising step runs at a noise level σ at
    most this, the keys/values that step's forward wrote into the chunk's pages (its
    conditional rows: its input at σ, tagged σ) are kept as the chunk's cache entry and the
    cache fill's forward is skipped (None: always fill). The cache then holds the chunk as
    noisy context, which a model trained with context noise up to that level (Diffusion
    Forcing, Chen et al. 2024; the built-in recipe's ``--ctx-sigma-max``, 0.3) has seen: one
    forward fewer per chunk (4 steps: σ = 1, 0.75, 0.5, 0.25; at 2 steps the last σ is 0.5
    and the fill runs). A recache still fills from the clean latents at ``ctx_sigma``.
    ``max_states``: sessions + branches the KV pool is sized for. ``recache``: recompute the
    window under a new prompt. ``attention_backend``: ``kernels.paged_attention`` backend.
    ``batched_guidance``: a denoising step that also runs negative forwards (classifier-free
    guidance, :meth:`PagedRunner._forwards`) runs them in one batch with its conditional
    forward instead of one after the other (the same values; one forward of 2-3 rows costs
    less than 2-3 forwards of one on a CPU, where this small model's time is per op, not per
    row). ``batch_invariant``: generate each job of a batch on its own, so that a stream's frames do
    not depend on which other sessions or fork branches shared its batch: exact replay of a
    session (issue 15). NOTE: measured on this CPU, small-row matmuls and oneDNN's
    convolutions pick their kernels by batch size, and a chunk batched with a fork branch came
    out different in the last bits (1 ulp in the latents, visible in the frames a few chunks
    later); False batches the jobs' forwards (more aggregate fps with several sessions, frames
    that depend on the batch).
    """

    window_chunks: int = 4
    sink: bool = False
    memory_chunks: int = 12
    ctx_sigma: float = 0.05
    ctx_noise: bool = True
    shift: float = 1.0
    last_step_cache_sigma: float | None = None
    max_states: int = 16
    recache: bool = True
    attention_backend: str = "auto"
    batched_guidance: bool = True
    batch_invariant: bool = True

    def __post_init__(self):
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


class PagedAttentionContext:
    """Attention over the KV pool for one forward of a batch of chunks.

    ``k_pool``/``v_pool``: ``(layers, pages, heads, page_size, head_dim)``. ``new_pages``:
    ``(B * pages_per_chunk,)`` page ids the chunk's keys/values are written to;
    ``always``/``candidates``: per batch row, pages always attended (sink + window + selected +
    own) and older pages to pick ``topk`` from per layer by key similarity. The CSR page lists
    are built on the pool's device (``kernels.paged_attention`` refuses mixed devices).
    """

    def __init__(
        self,
        k_pool: torch.Tensor,
        v_pool: torch.Tensor,
        new_pages: torch.Tensor,
        always: list[list[int]],
        candidates: list[list[int]],
        topk: int,
        backend: str,
    ):
        self.k_pool, self.v_pool = k_pool, v_pool
        self.new_pages = new_pages
        self.always, self.candidates, self.topk = always, candidates, topk
        self.backend = backend
        self._guided: dict[int, PagedAttentionContext] = {}
        ptr, idx = kernels.lists_to_csr(always, device=k_pool.device)
        # the lists are the same for every layer and denoising step of this forward batch:
        # checked and laid out once (kernels.plan_paged_attention)
        # (one query block per batch row: the chunk's frames attend as one block)
        page_size = k_pool.shape[3]
        q_block = len(new_pages) // max(len(always), 1) * page_size
        self._plan = kernels.plan_paged_attention(
            ptr, idx, num_pages=k_pool.shape[1], page_size=page_size,
            q_block_size=q_block or None, backend=backend)

    def with_negatives(self, copies: int, scratch: list[int]) -> PagedAttentionContext:
        """The context of one forward of ``copies`` negative batches stacked before this
        context's rows (rows ``[negative 1 (B); ...; negative n (B); conditional (B)]``): each
        negative row attends what its conditional row attends, with its own chunk's
        keys/values written to ``scratch`` pages (at least ``copies * B * pages_per_chunk``
        ids outside the allocator) instead of the chunk's pages, so that the conditional
        rows' keys/values are the ones the cache keeps. Built once per ``copies``."""
        if copies not in self._guided:
            rows = len(self.always)
            per_row = len(self.new_pages) // max(rows, 1)
            own = self.new_pages.tolist()
            if len(scratch) < copies * len(own):
                raise ValueError(f"{copies} negative copies of {len(own)} pages need as many "
                                 f"scratch pages, got {len(scratch)}")
            new_pages, always = [], []
            for c in range(copies):
                for r in range(rows):
                    mine = scratch[(c * rows + r) * per_row:(c * rows + r + 1) * per_row]
                    swap = dict(zip(own[r * per_row:(r + 1) * per_row], mine))
                    new_pages += mine
                    always.append([swap.get(p, p) for p in self.always[r]])
            self._guided[copies] = PagedAttentionContext(
                self.k_pool, self.v_pool,
                torch.cat([torch.tensor(new_pages, device=self.new_pages.device),
                           self.new_pages]),
                always + self.always, self.candidates * copies + self.candidates, self.topk,
                self.backend)
        return self._guided[copies]

    def attend(self, q, k, v, layer: int) -> torch.Tensor:
        """Write this chunk's keys/values ``(B, H, F * page, D)`` into its pages, then attend
        ``q`` ``(B, H, F * page, D)`` to the listed pages; returns ``(B, H, F * page, D)``."""
        b, h, lq, d = k.shape
        page = self.k_pool.shape[3]

        def to_pages(x):  # (B, H, F*page, D) -> (B*F, H, page, D)
            return x.reshape(b, h, lq // page, page, d).transpose(1, 2).reshape(-1, h, page, d)

        self.k_pool[layer].index_copy_(0, self.new_pages, to_pages(k).to(self.k_pool.dtype))
        self.v_pool[layer].index_copy_(0, self.new_pages, to_pages(v).to(self.v_pool.dtype))
        if self.topk and any(self.candidates):
            ptr, idx = kernels.select_pages_topk(
                q, self.k_pool[layer], self.always, self.candidates, self.topk, lq
            )
            return kernels.paged_attention(
                q.to(self.k_pool.dtype), self.k_pool[layer], self.v_pool[layer], ptr, idx,
                q_block_size=lq, backend=self.backend,
            )
        return self._plan.run(q.to(self.k_pool.dtype), self.k_pool[layer], self.v_pool[layer])


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

    #: the stage name of the time ``_plan`` takes (None: not reported)
    plan_stage: str | None = None
    #: negative forwards a family's denoising step may batch beside its conditional one
    #: (:meth:`_forwards`); the KV pool keeps that many scratch pages per state for them
    negative_forwards: int = 0
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
        self._scratch_pages = list(range(num_pages, num_pages + scratch))
        shape = (layers, num_pages + scratch, heads, page_size, head_dim)
        self.k_pool = torch.zeros(shape, dtype=dtype, device=device)
        self.v_pool = torch.zeros(shape, dtype=dtype, device=device)
        self.attention_backend = kernels.resolve_backend(config.attention_backend, device)
        self._lock = threading.RLock()
        # the cache fill and commits of the last generate(), run by finish() after the frames
        # were delivered (off the action-to-photon path) or before any other call
        self._deferred: list[Callable[[], None]] = []

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
    def _plan(self, states: list[RunnerState], actions: list[list[int]]) -> tuple[list, Any]:
        """Each state's next chunk record from its per-frame action ids, plus what the
        family's forward and ``_show`` need."""

    @abstractmethod
    def _conditioning(self, states: list[RunnerState], records: list) -> Any:
        """The conditioning of one forward of ``records`` (computed once per batch)."""

    @abstractmethod
    def _forward(self, x: torch.Tensor, sigma: float, cond: Any,
                 ctx: PagedAttentionContext) -> torch.Tensor:
        """One forward of chunks ``x`` at noise ``sigma``; writes their keys/values through
        ``ctx``."""

    def _forwards(self, x: torch.Tensor, sigma: float, conds: list[tuple],
                  ctx: PagedAttentionContext) -> list[torch.Tensor]:
        """:meth:`_forward` of the same chunks ``x`` under each conditioning of ``conds`` —
        negatives first, the conditional one last (its keys/values are the ones kept) — each
        a tuple of batch-first tensors or None. With ``batched_guidance``, one forward of the
        stacked rows (the negatives' keys/values in scratch pages); else one forward each,
        in order. Returns the outputs in the order of ``conds``."""
        n = len(conds)
        if n == 1 or not self.config.batched_guidance:
            return [self._forward(x, sigma, cond, ctx) for cond in conds]
        stacked = tuple(None if parts[0] is None else torch.cat(parts)
                        for parts in zip(*conds))
        out = self._forward(torch.cat([x] * n), sigma, stacked,
                            ctx.with_negatives(n - 1, self._scratch_pages))
        return list(out.chunk(n))

    def _denoise_forward(self, x: torch.Tensor, sigma: float, cond: Any,
                         ctx: PagedAttentionContext) -> torch.Tensor:
        """The forward of one denoising step (the cache fill calls :meth:`_forward` itself): a
        family that guides its denoiser (classifier-free guidance) overrides this."""
        return self._forward(x, sigma, cond, ctx)

    def _to_x0(self, x: torch.Tensor, sigma: float, out: torch.Tensor) -> torch.Tensor:
        """The clean-latent prediction from the model output (x0-parameterised by default)."""
        return out

    @abstractmethod
    def _noise(self, generator: torch.Generator) -> torch.Tensor:
        """Standard normal noise of one chunk drawn from ``generator``."""

    def _chunk_noise(self, job: ChunkJob, state: RunnerState, record: Any) -> torch.Tensor:
        """The initial noise of ``job``'s chunk (``record``: the family's plan of it): drawn
        from a generator seeded by ``job.seed``, else from the state's own; a family whose
        noise follows its world (the built-in camera) overrides this."""
        return self._noise(torch.Generator().manual_seed(job.seed)
                           if job.seed is not None else state.rng)

    def step_cost(self, steps: int) -> int:
        """Forwards between a chunk's actions and its frames at ``steps`` denoising steps (the
        engine's degradation skips step counts no cheaper than the one above): one a step,
        less the first where :meth:`_first_x0` stands in for it (as it does outside a prompt
        switch). The cache fill is not counted: it runs after delivery, in the time until
        the next chunk is due."""
        return steps - int(self._first_step_skipped(steps))

    def _first_step_skipped(self, steps: int) -> bool:
        """Whether a typical chunk of ``steps`` steps runs without its first forward."""
        return False

    def _first_x0(self, records: list, cond: Any, steps: int) -> torch.Tensor | None:
        """A guess of the batch's first prediction (σ = 1), shaped like its noise, that
        replaces that step's forward (``sampler.denoise``'s ``first_x0``); None (the
        default): every step runs the model."""
        return None

    @abstractmethod
    def _show(self, states: list[RunnerState], records: list, x0: torch.Tensor,
              plan: Any) -> list[np.ndarray]:
        """Each state's frames ``(F, H, W, 3)`` uint8 for its generated latents ``x0``."""

    def _commit_extra(self, state: RunnerState, record: Any, frames: np.ndarray) -> None:
        """What the family keeps beside the KV cache, updated with a committed chunk."""
        return None  # optional hook: nothing by default

    def _undo_extra(self, state: RunnerState, record: Any) -> None:
        """Undo ``_commit_extra`` for a rewound chunk (newest first)."""
        return None  # optional hook: nothing by default

    def _after_rewind(self, state: RunnerState) -> None:
        """Rebuild what cannot be undone chunk by chunk, after a rewind."""
        return None  # optional hook: nothing by default

    # -- locking and deferred work ------------------------------------------------------
    @contextlib.contextmanager
    def _settled(self):
        """The runner's lock, taken with the deferred work of the last generate() done
        first, so every call sees committed states."""
        with self._lock:
            self._run_deferred()
            yield

    @torch.no_grad()
    def _run_deferred(self) -> None:
        # NOTE: no_grad here, not only in generate(): the deferred cache fill runs later, from
        # finish() or any other call, and with autograd on, every fill's keys/values written
        # into the page pool chained a graph onto the pool that was never freed (~110 MB/s
        # under a fork flood, issue 12)
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
        with self._settled():
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
        with self._settled():
            state.prompt, state.text = text, emb
            state.needs_recache = self.config.recache and bool(state.history)
            self._on_prompt(state, blend_text, blend_weight)

    def fork(self, state: RunnerState) -> RunnerState:
        """A copy-on-write copy of ``state`` (shared pages, its own noise generator)."""
        with self._settled():
            return self._fork_state(state, state.table.fork(), fork_rng(state.rng))

    def free(self, state: RunnerState) -> None:
        """Release the state's pages. Idempotent."""
        with self._settled():
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
        with self._settled():
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
        with self._settled():
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
        with self._settled():
            groups: dict[tuple[int, int, str | None, int], list[int]] = {}
            for i, job in enumerate(jobs):
                try:
                    self._validate(job)
                    self._prefill(job.state)
                    if job.state.needs_recache:
                        self._recache(job.state)
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

    def _context(self, pages: list[list[int]], contexts: list[list[int]],
                 candidates: list[list[int]] | None = None,
                 attention: str | None = None) -> PagedAttentionContext:
        new = torch.tensor([p for ps in pages for p in ps], device=self.device)
        always = [c + p for c, p in zip(contexts, pages)]
        return PagedAttentionContext(self.k_pool, self.v_pool, new, always,
                                     candidates or [[] for _ in pages], self.topk_pages,
                                     attention or self.attention_backend)

    def _attended(self, state: RunnerState, record: Any) -> list[int]:
        """The pages a new chunk attends besides its own and the extra context: sink and
        window (a family may leave some out)."""
        return state.table.attended_pages()

    def _extra_context(self, state: RunnerState, record: Any) -> list[int]:
        """Older pages a family brings back into the attention context (default none)."""
        return []

    def _cache_fill(self, states: list[RunnerState], records: list, pages: list[list[int]],
                    contexts: list[list[int]]) -> None:
        """One forward of the records' clean latents at ``ctx_sigma`` into ``pages``."""
        cfg = self.config
        for state, rec in zip(states, records):
            if rec.context is None:
                rec.context = rec.latents
                if cfg.ctx_noise and cfg.ctx_sigma > 0:
                    # real noise at the context level (GameNGen/DIAMOND): the model then treats
                    # its own past output as uncertain, as in training, instead of trusting it
                    eps = torch.randn(rec.latents.shape, generator=state.rng)
                    rec.context = (1 - cfg.ctx_sigma) * rec.latents + cfg.ctx_sigma * eps
        x = torch.stack([r.context for r in records]).to(self.device)
        self._forward(x, cfg.ctx_sigma, self._conditioning(states, records),
                      self._context(pages, contexts, attention=states[0].attention))

    def _append(self, state: RunnerState, records: list) -> None:
        """Cache-fill ``records`` one after the other and append them to the state (prefill,
        observed frames)."""
        for rec in records:
            pages = self.allocator.allocate(self.pages_per_chunk)
            if pages is None:
                raise CapacityError("KV page pool exhausted", _POOL_RETRY_S)
            with self._returned_on_failure([pages]):
                self._cache_fill([state], [rec], [pages], [state.table.attended_pages()])
            state.table.append_chunk(pages)
            state.history.append(rec)

    def _recache(self, state: RunnerState) -> None:
        """Recompute the window's keys/values under the state's current conditioning into
        fresh pages and swap them in (copy-on-write: a fork sharing the old pages keeps
        them). CapacityError when the pool has no pages for it."""
        f = self.pages_per_chunk
        window = state.table.window_pages()
        num_chunks = len(window) // f
        records = list(state.history)[-num_chunks:] if num_chunks else []
        for n, rec in enumerate(records):
            pages = self.allocator.allocate(f)
            if pages is None:
                raise CapacityError("KV page pool exhausted", _POOL_RETRY_S)
            old = window[n * f:(n + 1) * f]
            with self._returned_on_failure([pages]):
                self._cache_fill([state], [rec], [pages],
                                 [state.table.sink_pages() + window[:n * f]])
            for o, p in zip(old, pages):
                state.table.replace_page(o, p)
            window[n * f:(n + 1) * f] = pages
        state.needs_recache = False

    def _trim_history(self, state: RunnerState) -> None:
        while len(state.history) > self.config.memory_chunks + (1 if self.config.sink else 0):
            state.history.popleft()

    def _generate_group(self, jobs: list[ChunkJob]) -> list[ChunkResult]:
        live, pages = allocate_chunks(self.allocator, len(jobs), self.pages_per_chunk)
        short = CapacityError("KV page pool exhausted", _POOL_RETRY_S)
        results: list[ChunkResult | None] = [
            None if i in live else ChunkResult(None, error=short) for i in range(len(jobs))
        ]
        if not live:
            return results
        with self._returned_on_failure(pages):
            return self._generate_live(jobs, live, pages, results)

    @contextlib.contextmanager
    def _returned_on_failure(self, pages: list[list[int]]):
        """Give freshly allocated ``pages`` back to the pool when the block raises (a failed
        forward must not leak them: the pool is shared by every session)."""
        try:
            yield
        except BaseException:
            self.allocator.decref([p for chunk in pages for p in chunk])
            raise

    def _generate_live(self, jobs: list[ChunkJob], live: list[int], pages: list[list[int]],
                       results: list[ChunkResult | None]) -> list[ChunkResult]:
        """The batch's chunk for the jobs ``live`` that got ``pages``: plan, denoise, show; the
        cache fill and the page-table append are left to :meth:`finish`."""
        states = [jobs[i].state for i in live]
        t0 = time.perf_counter()
        records, plan = self._plan(states, [jobs[i].actions for i in live])
        contexts = [self._attended(s, r) + self._extra_context(s, r)
                    for s, r in zip(states, records)]
        candidates = [[p for p in s.table.older_pages() if p not in c]
                      for s, c in zip(states, contexts)] if self.topk_pages else None
        cond = self._conditioning(states, records)
        noise = torch.stack([
            self._chunk_noise(jobs[i], s, r) for i, s, r in zip(live, states, records)
        ]).to(self.device)
        ctx = self._context(pages, contexts, candidates, states[0].attention)

        def predict_x0(x, sigma):
            return self._to_x0(x, sigma, self._denoise_forward(x, sigma, cond, ctx))

        steps = jobs[live[0]].steps
        t1 = time.perf_counter()
        x0 = denoise(predict_x0, noise, steps, self.config.shift,
                     first_x0=self._first_x0(records, cond, steps))
        t2 = time.perf_counter()
        for rec, lat in zip(records, x0):
            rec.latents = lat.float().cpu() if self.device.type != "cpu" else lat.float()
        frames = self._show(states, records, x0, plan)
        t3 = time.perf_counter()

        # the last step's forward left its keys/values in the chunk's pages: kept as the
        # cache entry where that noise level is context the model was trained on
        keep = self.config.last_step_cache_sigma
        fill = keep is None or step_sigmas(steps, self.config.shift)[-1] > keep + 1e-6

        def commit() -> None:  # deferred: see finish()
            if fill:
                with self._returned_on_failure(pages):
                    self._cache_fill(states, records, pages, contexts)
            for s, r, p, rgb in zip(states, records, pages, frames):
                s.table.append_chunk(p)
                s.history.append(r)
                self._commit_extra(s, r, rgb)
                self._trim_history(s)

        self._deferred.append(commit)
        stages = {"denoise": (t2 - t1) * 1e3, "decode": (t3 - t2) * 1e3}
        if self.plan_stage:
            stages[self.plan_stage] = (t1 - t0) * 1e3
        for n, i in enumerate(live):
            results[i] = ChunkResult(frames[n], dict(stages))
        return results
