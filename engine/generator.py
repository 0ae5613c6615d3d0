"""The neural world backend: memory read -> denoise -> cache fill -> decode -> memory write,
over the paged temporal KV cache and the spatial memory.

One :class:`WorldGenerator` holds the model, the autoencoder and one preallocated KV pool
``[num_layers, num_pages, heads, page_size, head_dim]`` shared by every session and branch; each
session's :class:`WorldState` owns a :class:`~engine.kv_cache.PageTable` (one page = the 64
tokens of one latent frame), a :class:`~engine.spatial_memory.SpatialMemory` (what it has shown,
in world coordinates) and its camera (position, velocity). Generating a chunk for a batch:

1. camera: the model's learned camera dynamics turn the chunk's actions into per-frame camera
   positions (integer world pixels);
2. base: each frame's window is read from the spatial memory at its position, once, and encoded
   (with planes saying where memory holds current and stale content);
3. allocate the chunk's pages; each query chunk attends (through ``kernels.paged_attention``,
   CSR page lists) to its sink + window pages, optionally older pages picked by camera overlap
   with the current view (spatial) or top-k by key similarity, and its own pages;
4. denoise in 1-4 flow-matching steps (``engine.sampler``), every step rewriting the chunk's
   keys/values in its own pages;
5. cache fill: one more forward of the clean chunk tagged with the context noise level writes
   the keys/values later chunks attend to (Self-Forcing / CausVid);
6. decode the latents to RGB with the autoencoder, batched, and write the frames into the
   spatial memory where it held nothing of the current prompt (write-once; the centred player
   sprite excluded).

A stream starts from real simulator frames of the prompt's scene (encoded, cache-filled and
written to memory as the first chunk). A prompt switch recaches the window under the new text
embedding (LongLive) and starts a new memory epoch (remembered ground is restyled on sight).
All methods take one lock: the engine thread generates while other threads may fork or free.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch
from diffusers.utils import logging as diffusers_logging

from worldstream import kernels
from worldstream.engine import text as text_encoder
from worldstream.engine.api import CapacityError
from worldstream.engine.backend import ChunkJob, ChunkResult, StateBudget
from worldstream.engine.kv_cache import PageAllocator, PageTable, allocate_chunks, pages_to_csr
from worldstream.engine.models.autoencoder import frames_to_tensor, tensor_to_frames
from worldstream.engine.models.loading import BUILTIN_DIR, load_autoencoder, load_world_model
from worldstream.engine.models.world_dit import WorldDiT
from worldstream.engine.sampler import denoise, fork_rng
from worldstream.engine.spatial_memory import (
    SpatialMemory,
    UndoRecord,
    centre_box,
    model_inputs,
    select_by_overlap,
)
from worldstream.engine.training.common import cpu_has_fast_bf16
from worldstream.engine.worlds.actions import IDLE
from worldstream.engine.worlds.simulator import WorldSimulator


@dataclass
class GeneratorConfig:
    """Streaming settings of the built-in model.

    ``window_chunks``: chunks always attended besides the current one (W). ``sink``: keep the
    first chunk attended for the whole stream. ``memory_chunks``: chunks retained (>= W; the
    extra ones are sparse-memory candidates and rewind history). ``topk_pages``: older pages
    attended per query chunk, picked by key similarity (0 = off). ``spatial_pages``: older
    pages attended per query chunk, picked by how much of the current view their frame's camera
    window covers (0 = off; the spatial top-k beside the recency window). ``ctx_sigma``: noise
    level the cache fill tags the context with, and the memory base (Diffusion Forcing
    stabilisation); ``ctx_noise``: also add real noise at that level (GameNGen/DIAMOND context
    augmentation). ``max_states``: sessions + branches the pool is sized for. ``dtype``: compute
    dtype. ``cpu_threads``: torch intra-op threads on CPU (process-wide; None = leave as is).
    ``shift``: timestep shift of the flow-match scheduler (``engine.sampler.step_sigmas``).
    ``memory_tiles``: spatial-memory tiles (64 px) kept per state (LRU beyond).
    ``pixel_residual``: where memory holds current content, show the remembered pixels plus the
    model's change to them (``memory + decode(x0) - decode(base)``) instead of ``decode(x0)``:
    remembered ground keeps its full sharpness instead of the autoencoder's, and the model's
    changes (water, clouds, creatures) still show; costs one more decode per frame.
    ``restyle_chunks``: after a prompt switch, this many chunks each start a new memory epoch,
    so everything in view reads as stale and is restyled again (at least 1: the switch itself);
    the model restyles in one frame what the simulator cross-fades over 12, and a second or
    third pass finishes what the first left half done.
    ``autoencoder_dtype``: the autoencoder's compute dtype (None: bf16 on CUDA and on CPUs
    with native bf16, where it halves encode + decode time — 35 -> 19 ms a frame measured on
    an AVX-512-BF16 EPYC core — else ``dtype``).
    ``batch_invariant``: generate each job of a batch on its own, so that a stream's frames
    do not depend on which other sessions or fork branches shared its batch: exact replay of
    a session (issue 15). NOTE: measured on this CPU, the model's small-row matmuls and
    oneDNN's convolutions pick their kernels by batch size, and a chunk batched with a branch
    came out different in the last bits (1 ulp in the latents, visible in the frames a few
    chunks later); False batches the jobs' forwards (more aggregate fps with several sessions).
    NOTE: one thread is the default because this model's ops are small: with two OpenMP
    threads on a 2-core machine that also runs the video encoder and the event loop, every op
    waits at a barrier for a descheduled thread — measured 140 ms vs 5.9 s per 4-step chunk
    under load.
    """

    window_chunks: int = 4
    sink: bool = False
    memory_chunks: int = 12
    topk_pages: int = 0
    spatial_pages: int = 0
    ctx_sigma: float = 0.05
    shift: float = 1.0
    max_states: int = 16
    recache: bool = True
    ctx_noise: bool = True
    memory_tiles: int = 256
    pixel_residual: bool = True
    restyle_chunks: int = 1
    batch_invariant: bool = True
    dtype: torch.dtype = torch.float32
    autoencoder_dtype: torch.dtype | None = None
    attention_backend: str = "auto"
    device: str = "cpu"
    cpu_threads: int | None = 1

    def __post_init__(self):
        if self.window_chunks < 1 or self.memory_chunks < self.window_chunks:
            raise ValueError("need 1 <= window_chunks <= memory_chunks")
        if not 0.0 <= self.ctx_sigma < 1.0:
            raise ValueError(f"ctx_sigma must be in [0, 1), got {self.ctx_sigma}")
        if self.max_states < 1 or self.topk_pages < 0 or self.spatial_pages < 0:
            raise ValueError("max_states must be >= 1, topk_pages and spatial_pages >= 0")
        if self.memory_tiles < 1 or self.restyle_chunks < 1:
            raise ValueError("memory_tiles and restyle_chunks must be >= 1")


@dataclass
class _ChunkRecord:
    """What a retained chunk was computed from (for recache and rewind)."""

    latents: torch.Tensor | None  # (F, C, h, w) model-space clean latents
    base: torch.Tensor  # (F, C, h, w) model-space memory bases as fed (context noise included)
    known: torch.Tensor  # (F, 2, h, w) current/stale fractions of the bases
    actions: list[int]
    position: int  # time index of its first frame
    origins: np.ndarray  # (F, 2) int64 camera windows' top-left corners, world px
    camera: tuple[np.ndarray, torch.Tensor]  # (position, velocity) after its last frame
    context: torch.Tensor | None = None  # (F, C, h, w) what the cache fill consumed
    undo: list[UndoRecord] = field(default_factory=list)  # memory writes, oldest first


@dataclass
class _MemoryViews:
    """What memory showed the frames of a chunk being generated, flattened over the batch:
    ``pictures (N, H, W, 3)`` uint8, ``current (N, H, W)`` bool, ``base (N, C, h, w)`` their
    clean model-space latents."""

    pictures: np.ndarray
    current: np.ndarray
    base: torch.Tensor


@dataclass
class WorldState:
    """One session's (or branch's) model state."""

    table: PageTable
    prompt: str
    text: torch.Tensor  # (384,) current (blended) prompt embedding
    rng: torch.Generator
    memory: SpatialMemory
    history: deque = field(default_factory=deque)  # _ChunkRecord per retained chunk, newest last
    start_frames: np.ndarray | None = None  # (F, H, W, 3) uint8, pending prefill
    needs_recache: bool = False
    restyle_left: int = 0  # chunks that still start a new memory epoch (after a prompt switch)
    freed: bool = False

    @property
    def position(self) -> int:
        last = self.history[-1]
        return last.position + len(last.actions)

    @property
    def camera(self) -> tuple[np.ndarray, torch.Tensor]:
        """(position ``(2,)`` float64 world px, velocity ``(2,)`` float32 px/frame) now."""
        if not self.history:
            return np.zeros(2), torch.zeros(2)
        return self.history[-1].camera


class PagedAttentionContext:
    """Attention over the KV pool for one forward of a batch of chunks.

    ``new_pages``: ``(B * F,)`` page ids the chunk's keys/values are written to;
    ``always``/``candidates``: per batch row, pages always attended (sink + window + spatially
    selected + own) and older pages to pick ``topk`` from per layer by key similarity.
    """

    def __init__(
        self,
        k_pool,
        v_pool,
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
        ptr, idx = pages_to_csr(always)
        dev = k_pool.device
        self._csr = (
            torch.tensor(ptr, dtype=torch.int32, device=dev),
            torch.tensor(idx, dtype=torch.int32, device=dev),
        )

    def attend(self, q, k, v, layer):
        b, h, lq, d = k.shape
        page = self.k_pool.shape[3]

        # write this chunk's keys/values into its pages: (B, H, F*page, D) -> (B*F, H, page, D)
        def to_pages(x):
            return x.reshape(b, h, lq // page, page, d).transpose(1, 2).reshape(-1, h, page, d)

        self.k_pool[layer].index_copy_(0, self.new_pages, to_pages(k).to(self.k_pool.dtype))
        self.v_pool[layer].index_copy_(0, self.new_pages, to_pages(v).to(self.v_pool.dtype))
        if self.topk and any(self.candidates):
            ptr, idx = kernels.select_pages_topk(
                q, self.k_pool[layer], self.always, self.candidates, self.topk, lq
            )
        else:
            ptr, idx = self._csr
        return kernels.paged_attention(
            q.to(self.k_pool.dtype),
            self.k_pool[layer],
            self.v_pool[layer],
            ptr,
            idx,
            q_block_size=lq,
            backend=self.backend,
        )


def _to(module: torch.nn.Module, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    module = module.to(device).eval()
    # diffusers warns on any dtype cast, even a no-op one (and names no module to keep in fp32
    # for these): cast only when it changes something, quietly
    if dtype == torch.float32:
        return module
    verbosity = diffusers_logging.get_verbosity()
    diffusers_logging.set_verbosity_error()
    try:
        return module.to(dtype=dtype)
    finally:
        diffusers_logging.set_verbosity(verbosity)


class WorldGenerator:
    """``engine.backend.WorldBackend`` for a trained :class:`WorldDiT` + autoencoder."""

    name = "builtin"
    default_fps = 15
    rewind_chunks = 4
    #: ``new_state`` takes ``start_frames`` (a start from a picture)
    starts_from_frames = True

    def __init__(self, model: WorldDiT, autoencoder, config: GeneratorConfig | None = None):
        self.config = cfg = config or GeneratorConfig()
        self.device = torch.device(cfg.device)
        if self.device.type == "cpu" and cfg.cpu_threads:
            torch.set_num_threads(cfg.cpu_threads)
        self.model = _to(model, self.device, cfg.dtype)
        self.ae_dtype = cfg.autoencoder_dtype or (
            torch.bfloat16
            if self.device.type == "cuda" or (self.device.type == "cpu" and cpu_has_fast_bf16())
            else cfg.dtype
        )
        self.ae = _to(autoencoder, self.device, self.ae_dtype)
        mc = model.config
        self.chunk_frames = mc.chunk_frames
        self.width = self.height = mc.image_size
        self.downsample = mc.image_size // mc.latent_size
        self._exclude = centre_box(mc.image_size, mc.view_box)
        self.max_states = cfg.max_states
        self.rewind_chunks = max(cfg.memory_chunks - cfg.window_chunks, 0)
        head_dim = mc.dim // mc.num_heads
        page = model.tokens_per_frame
        # pages per state: sink + retained chunks + the chunk being generated + a recache copy
        per_state = self.chunk_frames * (
            (1 if cfg.sink else 0) + cfg.memory_chunks + 1 + cfg.window_chunks
        )
        num_pages = per_state * cfg.max_states
        self.allocator = PageAllocator(num_pages)
        shape = (mc.depth, num_pages, mc.num_heads, page, head_dim)
        self.k_pool = torch.zeros(shape, dtype=cfg.dtype, device=self.device)
        self.v_pool = torch.zeros(shape, dtype=cfg.dtype, device=self.device)
        self.backend = kernels.resolve_backend(cfg.attention_backend, self.device)
        self._lock = threading.RLock()
        self._budget = StateBudget(cfg.max_states)
        # the cache fill and memory writes of the last generate(), run by finish() after the
        # frames were delivered (off the action-to-photon path) or before any other call
        self._deferred: list[Callable[[], None]] = []

    @contextlib.contextmanager
    def _settled(self):
        """The generator's lock, taken with the deferred work of the last generate() done
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
        (its clean latents' keys/values into the KV cache), page-table append and spatial
        memory write. Returns ``{"cache_fill": ms}``. The engine calls it once the frames are
        on their way; any other call runs it first, so calling it is optional."""
        t0 = time.perf_counter()
        with self._lock:
            self._run_deferred()
        return {"cache_fill": (time.perf_counter() - t0) * 1e3}

    # -- state lifecycle ------------------------------------------------------------------
    def new_state(
        self, prompt: str, seed: int, start_frames: np.ndarray | None = None
    ) -> WorldState:
        """A stream that starts from ``start_frames`` (``(chunk_frames, H, W, 3)`` uint8), by
        default simulator frames of the prompt's nearest scene at world ``seed``."""
        emb = torch.as_tensor(np.array(text_encoder.embed(prompt)))
        if start_frames is not None and start_frames.shape != (
            self.chunk_frames,
            self.height,
            self.width,
            3,
        ):
            raise ValueError(
                f"start_frames must be ({self.chunk_frames}, {self.height}, "
                f"{self.width}, 3) uint8, got {start_frames.shape}"
            )
        with self._settled():
            self._budget.reserve()
            if start_frames is None:
                sim = WorldSimulator(seed, text_encoder.scene_for_prompt(prompt))
                frames = np.stack([sim.step(IDLE) for _ in range(self.chunk_frames)])
            else:
                frames = start_frames
            table = PageTable(
                self.allocator,
                pages_per_chunk=self.chunk_frames,
                window_chunks=self.config.window_chunks,
                sink=self.config.sink,
                max_chunks=self.config.memory_chunks,
            )
            return WorldState(
                table,
                prompt,
                emb,
                torch.Generator().manual_seed(seed),
                SpatialMemory(max_tiles=self.config.memory_tiles),
                start_frames=frames,
            )

    @torch.no_grad()
    def observe(self, state: WorldState, frames: np.ndarray, actions: list[int]) -> None:
        """Append real frames (``(chunk_frames, H, W, 3)`` uint8, with the actions that
        produced them) to the state's context and memory instead of generating them: teacher
        forcing, and restoring a session from its recent frames. The camera follows the
        actions through the model's camera dynamics."""
        with self._settled():
            self._prepare(state)
            rec = self._plan([state], [list(actions)])[0][0]
            rec.latents = self.encode_frames(frames)
            self._cache_fill_chunks(state, [rec], replace=False)
            self._remember(state, rec, frames)
            self._trim_history(state)

    def prepare_prompt(self, text: str, blend_text: str | None = None,
                       blend_weight: float = 0.0) -> None:
        """Encode a prompt ahead (thread-safe; the engine calls it off its thread): warms the
        text-embedding cache so that :meth:`set_prompt` is a lookup. ValueError for a bad
        prompt."""
        text_encoder.embed_blend(text, blend_text, blend_weight)

    def set_prompt(
        self, state: WorldState, text: str, blend_text: str | None = None, blend_weight: float = 0.0
    ) -> None:
        emb = torch.as_tensor(np.array(text_encoder.embed_blend(text, blend_text, blend_weight)))
        with self._settled():
            state.prompt, state.text = text, emb
            state.needs_recache = self.config.recache and bool(state.history)
            state.restyle_left = self.config.restyle_chunks

    def fork(self, state: WorldState) -> WorldState:
        with self._settled():
            self._budget.reserve()
            return WorldState(
                state.table.fork(),
                state.prompt,
                state.text,
                fork_rng(state.rng),
                state.memory.fork(),
                deque(replace(r, undo=list(r.undo)) for r in state.history),
                state.start_frames,
                state.needs_recache,
                state.restyle_left,
            )

    def free(self, state: WorldState) -> None:
        with self._settled():
            if not state.freed:
                state.table.free()
                state.freed = True
                self._budget.release()

    def rewind(self, state: WorldState, chunks: int) -> None:
        """Drop the newest ``chunks`` chunks: their pages, their camera motion and what they
        wrote to the spatial memory. ValueError, with nothing changed, beyond what is kept."""
        with self._settled():
            if chunks >= len(state.history):
                raise ValueError(
                    f"cannot rewind {chunks} chunks; {max(len(state.history) - 1, 0)} are kept"
                )
            state.table.rewind(chunks)
            for _ in range(chunks):
                for undo in reversed(state.history.pop().undo):
                    state.memory.undo(undo)

    # -- generation -----------------------------------------------------------------------
    @torch.no_grad()
    def generate(self, jobs: list[ChunkJob]) -> list[ChunkResult]:
        """One chunk per job; jobs are batched by (frames, steps), or each run on its own with
        ``batch_invariant``. Per-job failures (pool
        exhausted, bad actions) come back as ``ChunkResult.error``."""
        results: list[ChunkResult | None] = [None] * len(jobs)
        with self._settled():
            groups: dict[tuple[int, int], list[int]] = {}
            for i, job in enumerate(jobs):
                try:
                    self._validate(job)
                    self._prepare(job.state)
                    key = (job.num_frames, job.steps, i if self.config.batch_invariant else -1)
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
        if any(not 0 <= a < self.model.config.num_actions for a in job.actions):
            raise ValueError(f"action ids must be in [0, {self.model.config.num_actions})")

    def _prepare(self, state: WorldState) -> None:
        """Prefill the start frames, or recache after a prompt switch (both cache fills)."""
        if state.start_frames is not None:
            frames = state.start_frames
            # the start frames are given, not stepped: the camera stays at the origin
            rec = self._plan([state], [[IDLE] * len(frames)], move=False)[0][0]
            rec.latents = self.encode_frames(frames)
            self._cache_fill_chunks(state, [rec], replace=False)
            self._remember(state, rec, frames)
            state.start_frames = None
        elif state.needs_recache:
            window = list(state.history)[-self.config.window_chunks :]
            self._cache_fill_chunks(state, window, replace=True)
            state.needs_recache = False

    def _plan(
        self, states: list[WorldState], actions: list[list[int]], move: bool = True
    ) -> tuple[list[_ChunkRecord], _MemoryViews]:
        """Each state's next chunk up to its latents: the camera path of its actions (the
        model's camera dynamics), each frame's memory base read at that path and encoded.
        Also returns what memory showed each frame (for the pixel residual)."""
        cfg = self.config
        size = self.width
        records, pictures, current = [], [], []
        for state, acts in zip(states, actions):
            if move and state.restyle_left > 0:
                state.memory.new_epoch()  # what was shown before now reads as stale
                state.restyle_left -= 1
            pos, vel = state.camera
            if move:
                disp, vel = self.model.camera.rollout(
                    vel.to(self.device), torch.tensor(acts, device=self.device)
                )
                path = pos + np.cumsum(disp.cpu().double().numpy(), axis=0)
            else:
                path = np.repeat(pos[None], len(acts), axis=0)
            origins = np.floor(path).astype(np.int64)
            known = []
            for x0, y0 in origins:
                read = state.memory.read(x0, y0, size)
                rgb, planes = model_inputs(read, self.downsample)
                pictures.append(rgb)
                current.append(read.current)
                known.append(torch.as_tensor(planes))
            records.append(
                _ChunkRecord(
                    None,
                    None,
                    torch.stack(known),
                    list(acts),
                    state.position if state.history else 0,
                    origins,
                    (path[-1], vel.float().cpu()),
                )
            )
        base = self.encode_frames(np.stack(pictures)).cpu()
        views = _MemoryViews(np.stack(pictures), np.stack(current), base)
        f = len(actions[0])
        for n, (state, rec) in enumerate(zip(states, records)):
            rec.base = base[n * f : (n + 1) * f]
            if cfg.ctx_noise and cfg.ctx_sigma > 0:
                eps = torch.randn(rec.base.shape, generator=state.rng)
                rec.base = (1 - cfg.ctx_sigma) * rec.base + cfg.ctx_sigma * eps
        return records, views

    def _remember(self, state: WorldState, rec: _ChunkRecord, frames: np.ndarray) -> None:
        """Write a chunk's frames ``(F, H, W, 3)`` uint8 into the state's spatial memory."""
        for (x0, y0), rgb in zip(rec.origins, frames):
            rec.undo.append(state.memory.write(x0, y0, rgb, self._exclude))

    def _cache_fill_chunks(
        self, state: WorldState, records: list[_ChunkRecord], replace: bool
    ) -> None:
        """Cache-fill ``records`` one after the other under the state's current text; new
        pages are appended (prefill) or swapped in for the window's (recache, copy-on-write)."""
        table = state.table
        window = table.window_pages()
        for n, rec in enumerate(records):
            pages = self.allocator.allocate(self.chunk_frames)
            if pages is None:
                raise CapacityError("KV page pool exhausted", 2.0)
            if replace:
                old = window[n * self.chunk_frames : (n + 1) * self.chunk_frames]
                context = table.sink_pages() + window[: n * self.chunk_frames]
            else:
                context = table.attended_pages()
            self._forward_fill([state], [rec], [pages], [context])
            if replace:
                for o, p in zip(old, pages):
                    table.replace_page(o, p)
                window[n * self.chunk_frames : (n + 1) * self.chunk_frames] = pages
            else:
                table.append_chunk(pages)
                state.history.append(rec)

    def _inputs(self, states, records):
        """Conditioning tensors for a batch of chunks (one record per state)."""
        f = self.chunk_frames
        dev, dt = self.device, self.config.dtype
        base = torch.stack([r.base for r in records]).to(dev, dt)
        known = torch.stack([r.known for r in records]).to(dev, dt)
        base_sigma = torch.full((len(records), f), self.config.ctx_sigma, device=dev)
        actions = torch.tensor([r.actions for r in records], device=dev)
        txt = torch.stack([s.text for s in states]).to(dev)[:, None].expand(-1, f, -1)
        pos = torch.tensor([[r.position + i for i in range(f)] for r in records], device=dev)
        return base, base_sigma, known, actions, txt, pos

    def _spatial_pages(self, state: WorldState, origins: np.ndarray) -> list[int]:
        """Older pages whose frame's camera window overlaps the new chunk's view most (up to
        ``spatial_pages``, overlap > 0), oldest first: revisited places come back into the
        attention context even when they left the recency window long ago."""
        k = self.config.spatial_pages
        older = state.table.older_pages()
        if not k or not older:
            return []
        f = self.chunk_frames
        # the table and the history hold the same chunks, newest last; older pages are the
        # chunks before the window
        recs = list(state.history)[-(len(older) // f + self.config.window_chunks) :]
        page_origins = [o for rec in recs[: len(older) // f] for o in rec.origins]
        return select_by_overlap(older, page_origins, origins[-1], self.width, k)

    def _context(
        self,
        pages: list[list[int]],
        contexts: list[list[int]],
        candidates: list[list[int]] | None = None,
    ) -> PagedAttentionContext:
        new = torch.tensor([p for ps in pages for p in ps], device=self.device)
        always = [c + p for c, p in zip(contexts, pages)]
        return PagedAttentionContext(
            self.k_pool,
            self.v_pool,
            new,
            always,
            candidates or [[] for _ in pages],
            self.config.topk_pages,
            self.backend,
        )

    def _forward_fill(self, states, records, pages, contexts) -> None:
        cfg = self.config
        for state, rec in zip(states, records):
            if rec.context is None:
                rec.context = rec.latents
                if cfg.ctx_noise and cfg.ctx_sigma > 0:
                    # real noise at the context level (GameNGen/DIAMOND): the model then treats
                    # its own past output as uncertain, as in training, instead of trusting it
                    eps = torch.randn(rec.latents.shape, generator=state.rng)
                    rec.context = (1 - cfg.ctx_sigma) * rec.latents + cfg.ctx_sigma * eps
        base, base_sigma, known, actions, txt, pos = self._inputs(states, records)
        latents = torch.stack([r.context for r in records]).to(self.device, cfg.dtype)
        sigma = torch.full(actions.shape, cfg.ctx_sigma, device=self.device)
        self.model(
            latents,
            base,
            base_sigma,
            known,
            sigma,
            actions,
            txt,
            pos,
            self._context(pages, contexts),
        )

    def _trim_history(self, state: WorldState) -> None:
        while len(state.history) > self.config.memory_chunks + (1 if self.config.sink else 0):
            state.history.popleft()

    def encode_frames(self, frames: np.ndarray) -> torch.Tensor:
        """``(N, H, W, 3)`` uint8 frames -> ``(N, C, h, w)`` float32 model-space latents."""
        with torch.no_grad():
            x = frames_to_tensor(frames).to(self.device, self.ae_dtype)
            return self.model.normalize(self.ae.encoder(x).float())

    def decode_latents(self, latents: torch.Tensor) -> np.ndarray:
        """Model-space latents ``(N, C, h, w)`` -> ``(N, H, W, 3)`` uint8 frames."""
        with torch.no_grad():
            flat = self.model.denormalize(latents.to(self.device).float())
            return (
                tensor_to_frames(self.ae.decoder(flat.to(self.ae_dtype)).float().clamp(-1, 1))
                .cpu()
                .numpy()
            )

    def _show(self, x0: torch.Tensor, views: _MemoryViews) -> np.ndarray:
        """The frames ``(N, H, W, 3)`` uint8 for generated latents ``(N, C, h, w)``: decoded,
        or with ``pixel_residual`` the remembered pixels plus the model's change to them where
        memory holds current content (see :class:`GeneratorConfig`)."""
        if not self.config.pixel_residual:
            return self.decode_latents(x0)
        both = self.decode_latents(torch.cat([x0.float().cpu(), views.base]))
        model, decoded_base = both[: len(x0)].astype(np.int16), both[len(x0) :]
        change = model - decoded_base
        shown = np.clip(views.pictures + change, 0, 255).astype(np.uint8)
        return np.where(views.current[..., None], shown, model.astype(np.uint8))

    def _generate_group(self, jobs: list[ChunkJob]) -> list[ChunkResult]:
        cfg, f = self.config, self.chunk_frames
        mc = self.model.config
        live, pages = allocate_chunks(self.allocator, len(jobs), f)
        short = CapacityError("KV page pool exhausted", 2.0)
        results: list[ChunkResult | None] = [
            None if i in live else ChunkResult(None, error=short) for i in range(len(jobs))
        ]
        if not live:
            return results
        states = [jobs[i].state for i in live]
        t0 = time.perf_counter()
        records, views = self._plan(states, [jobs[i].actions for i in live])
        contexts = [
            s.table.attended_pages() + self._spatial_pages(s, r.origins)
            for s, r in zip(states, records)
        ]
        candidates = [
            [p for p in s.table.older_pages() if p not in c] for s, c in zip(states, contexts)
        ]
        base, base_sigma, known, actions, txt, pos = self._inputs(states, records)
        noise = torch.stack(
            [
                torch.randn(
                    (f, mc.latent_channels, mc.latent_size, mc.latent_size),
                    generator=(
                        torch.Generator().manual_seed(jobs[i].seed)
                        if jobs[i].seed is not None
                        else s.rng
                    ),
                )
                for i, s in zip(live, states)
            ]
        ).to(self.device)
        ctx = self._context(pages, contexts, candidates)

        def predict_x0(x, sigma):
            sig = torch.full(actions.shape, sigma, device=self.device)
            return self.model(
                x.to(cfg.dtype), base, base_sigma, known, sig, actions, txt, pos, ctx
            )

        t1 = time.perf_counter()
        x0 = denoise(predict_x0, noise, jobs[live[0]].steps, cfg.shift)
        t2 = time.perf_counter()
        for r, lat in zip(records, x0):
            r.latents = lat.float().cpu() if self.device.type != "cpu" else lat.float()
        rgb = self._show(x0.reshape(-1, *x0.shape[2:]), views)
        rgb = rgb.reshape(len(live), f, self.height, self.width, 3)
        t3 = time.perf_counter()

        def commit() -> None:  # deferred: see finish()
            self._forward_fill(states, records, pages, contexts)
            for s, r, p, frames in zip(states, records, pages, rgb):
                s.table.append_chunk(p)
                s.history.append(r)
                self._remember(s, r, frames)
                self._trim_history(s)

        self._deferred.append(commit)
        stages = {
            "memory_read": (t1 - t0) * 1e3,
            "denoise": (t2 - t1) * 1e3,
            "decode": (t3 - t2) * 1e3,
        }
        for n, i in enumerate(live):
            results[i] = ChunkResult(rgb[n], dict(stages))
        return results


def load_builtin_backend(path: str | Path = BUILTIN_DIR, **kwargs) -> WorldGenerator:
    """The shipped built-in model (``assets/builtin/{transformer,vae}``) as a backend.
    ``kwargs`` go to :class:`GeneratorConfig`. FileNotFoundError names a missing weights file."""
    path = Path(path)
    return WorldGenerator(
        load_world_model(path / "transformer"),
        load_autoencoder(path / "vae"),
        GeneratorConfig(**kwargs),
    )
