"""The neural world backend: denoise -> cache fill -> decode, over the paged temporal KV cache.

One :class:`WorldGenerator` holds the model, the autoencoder and one preallocated KV pool
``[num_layers, num_pages, heads, page_size, head_dim]`` shared by every session and branch; each
session's :class:`WorldState` owns a :class:`~engine.kv_cache.PageTable` (one page = the 64
tokens of one latent frame). Generating a chunk for a batch of states:

1. allocate the chunk's pages; each query chunk attends (through ``kernels.paged_attention``,
   CSR page lists) to its sink + window pages, optionally top-k older pages, and its own pages;
2. denoise in 1-4 flow-matching steps (``engine.sampler``), every step rewriting the chunk's
   keys/values in its own pages;
3. cache fill: one more forward of the clean chunk tagged with the context noise level writes
   the keys/values later chunks attend to (Self-Forcing / CausVid);
4. decode the latents to RGB with the autoencoder, batched.

A stream starts from real simulator frames of the prompt's scene (encoded and cache-filled as
the first chunk). A prompt switch recaches the window under the new text embedding (LongLive).
All methods take one lock: the engine thread generates while other threads may fork or free.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

import kernels
from engine import text as text_encoder
from engine.api import CapacityError
from engine.backend import ChunkJob, ChunkResult, StateBudget
from engine.kv_cache import PageAllocator, PageTable, allocate_chunks, pages_to_csr
from engine.models.autoencoder import frames_to_tensor, tensor_to_frames
from engine.models.loading import BUILTIN_DIR, load_autoencoder, load_world_model
from engine.models.world_dit import WorldDiT
from engine.sampler import denoise, fork_rng
from engine.worlds.actions import IDLE
from engine.worlds.simulator import WorldSimulator


@dataclass
class GeneratorConfig:
    """Streaming settings of the built-in model.

    ``window_chunks``: chunks always attended besides the current one (W). ``sink``: keep the
    first chunk attended for the whole stream. ``memory_chunks``: chunks retained (>= W; the
    extra ones are sparse-memory candidates and rewind history). ``topk_pages``: older pages
    attended per query chunk when memory exceeds the window (0 = window only). ``ctx_sigma``:
    noise level the cache fill tags the context with (Diffusion Forcing stabilisation);
    ``ctx_noise``: also add real noise at that level (GameNGen/DIAMOND context augmentation).
    ``max_states``: sessions + branches the pool is sized for. ``dtype``: compute dtype.
    ``cpu_threads``: torch intra-op threads on CPU (process-wide; None = leave as is).
    ``shift``: timestep shift of the flow-match scheduler (``engine.sampler.step_sigmas``); 1.0
    (noise levels 1, 0.75, 0.5, 0.25) ends the last step at a lower level than SD3's 2.0
    (…, 0.4), so less detail is averaged away: on held-out seeds 950,000+ free rollouts kept
    0.18 of the real frames' sharpness instead of 0.07 and followed the keys in 0.41 of the
    chunks instead of 0.32, at 0.5 dB lower PSNR (model card).
    NOTE: one thread is the default because this model's ops are small: with two OpenMP
    threads on a 2-core machine that also runs the video encoder and the event loop, every op
    waits at a barrier for a descheduled thread — measured 140 ms vs 5.9 s per 4-step chunk
    under load.
    """

    window_chunks: int = 3
    sink: bool = False
    memory_chunks: int = 8
    topk_pages: int = 0
    ctx_sigma: float = 0.05
    shift: float = 1.0
    max_states: int = 16
    recache: bool = True
    ctx_noise: bool = True
    dtype: torch.dtype = torch.float32
    attention_backend: str = "auto"
    device: str = "cpu"
    cpu_threads: int | None = 1

    def __post_init__(self):
        if self.window_chunks < 1 or self.memory_chunks < self.window_chunks:
            raise ValueError("need 1 <= window_chunks <= memory_chunks")
        if not 0.0 <= self.ctx_sigma < 1.0:
            raise ValueError(f"ctx_sigma must be in [0, 1), got {self.ctx_sigma}")
        if self.max_states < 1 or self.topk_pages < 0:
            raise ValueError("max_states must be >= 1 and topk_pages >= 0")


@dataclass
class _ChunkRecord:
    """What a retained chunk was computed from (for recache and rewind)."""

    latents: torch.Tensor  # (F, C, h, w) model-space clean latents
    prev: torch.Tensor | None  # (C, h, w) the frame fed to it, None for the first chunk
    actions: list[int]
    position: int  # time index of its first frame
    context: torch.Tensor | None = None  # (F, C, h, w) what the cache fill consumed

    def last_context_frame(self) -> torch.Tensor:
        """The frame the next chunk is fed (its cache-filled form)."""
        return (self.latents if self.context is None else self.context)[-1]


@dataclass
class WorldState:
    """One session's (or branch's) model state."""

    table: PageTable
    prompt: str
    text: torch.Tensor  # (384,) current (blended) prompt embedding
    rng: torch.Generator
    history: deque = field(default_factory=deque)  # _ChunkRecord per retained chunk, newest last
    start_frames: np.ndarray | None = None  # (F, H, W, 3) uint8, pending prefill
    needs_recache: bool = False
    freed: bool = False

    @property
    def position(self) -> int:
        last = self.history[-1]
        return last.position + len(last.actions)


class PagedAttentionContext:
    """Attention over the KV pool for one forward of a batch of chunks.

    ``new_pages``: ``(B * F,)`` page ids the chunk's keys/values are written to;
    ``always``/``candidates``: per batch row, pages always attended (sink + window + own) and
    older pages to pick ``topk`` from per layer.
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
    # diffusers warns on any dtype cast, even a no-op one: cast only when it changes something
    return module if dtype == torch.float32 else module.to(dtype=dtype)


class WorldGenerator:
    """``engine.backend.WorldBackend`` for a trained :class:`WorldDiT` + autoencoder."""

    name = "builtin"
    default_fps = 15
    rewind_chunks = 4

    def __init__(self, model: WorldDiT, autoencoder, config: GeneratorConfig | None = None):
        self.config = cfg = config or GeneratorConfig()
        self.device = torch.device(cfg.device)
        if self.device.type == "cpu" and cfg.cpu_threads:
            torch.set_num_threads(cfg.cpu_threads)
        self.model = _to(model, self.device, cfg.dtype)
        self.ae = _to(autoencoder, self.device, cfg.dtype)
        mc = model.config
        self.chunk_frames = mc.chunk_frames
        self.width = self.height = mc.latent_size * 8
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
        with self._lock:
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
                table, prompt, emb, torch.Generator().manual_seed(seed), start_frames=frames
            )

    @torch.no_grad()
    def observe(self, state: WorldState, frames: np.ndarray, actions: list[int]) -> None:
        """Append real frames (``(chunk_frames, H, W, 3)`` uint8, with the actions that
        produced them) to the state's context instead of generating them: teacher forcing,
        and restoring a session from its recent frames."""
        with self._lock:
            self._prepare(state)
            x = frames_to_tensor(frames).to(self.device, self.config.dtype)
            latents = self.model.normalize(self.ae.encoder(x).float())
            rec = _ChunkRecord(
                latents, state.history[-1].last_context_frame(), list(actions), state.position
            )
            self._cache_fill_chunks(state, [rec], replace=False)
            self._trim_history(state)

    def set_prompt(
        self, state: WorldState, text: str, blend_text: str | None = None, blend_weight: float = 0.0
    ) -> None:
        emb = torch.as_tensor(np.array(text_encoder.embed_blend(text, blend_text, blend_weight)))
        with self._lock:
            state.prompt, state.text = text, emb
            state.needs_recache = self.config.recache and bool(state.history)

    def fork(self, state: WorldState) -> WorldState:
        with self._lock:
            self._budget.reserve()
            return WorldState(
                state.table.fork(),
                state.prompt,
                state.text,
                fork_rng(state.rng),
                deque(state.history),
                state.start_frames,
                state.needs_recache,
            )

    def free(self, state: WorldState) -> None:
        with self._lock:
            if not state.freed:
                state.table.free()
                state.freed = True
                self._budget.release()

    def rewind(self, state: WorldState, chunks: int) -> None:
        with self._lock:
            if chunks >= len(state.history):
                raise ValueError(
                    f"cannot rewind {chunks} chunks; {max(len(state.history) - 1, 0)} are kept"
                )
            state.table.rewind(chunks)
            for _ in range(chunks):
                state.history.pop()

    # -- generation -----------------------------------------------------------------------
    @torch.no_grad()
    def generate(self, jobs: list[ChunkJob], decode: bool = True) -> list[ChunkResult]:
        """One chunk per job; jobs are batched by (frames, steps). Per-job failures (pool
        exhausted, bad actions) come back as ``ChunkResult.error``. ``decode=False`` skips the
        autoencoder (frames None; the latents are in ``state.history``), for evaluation."""
        results: list[ChunkResult | None] = [None] * len(jobs)
        with self._lock:
            groups: dict[tuple[int, int], list[int]] = {}
            for i, job in enumerate(jobs):
                try:
                    self._validate(job)
                    self._prepare(job.state)
                    groups.setdefault((job.num_frames, job.steps), []).append(i)
                except Exception as err:  # isolate this job's failure
                    results[i] = ChunkResult(None, error=err)
            for idx in groups.values():
                for i, res in zip(idx, self._generate_group([jobs[i] for i in idx], decode)):
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
            x = frames_to_tensor(state.start_frames).to(self.device, self.config.dtype)
            latents = self.model.normalize(self.ae.encoder(x).float())
            self._cache_fill_chunks(
                state, [_ChunkRecord(latents, None, [IDLE] * len(latents), 0)], replace=False
            )
            state.start_frames = None
        elif state.needs_recache:
            window = list(state.history)[-self.config.window_chunks :]
            self._cache_fill_chunks(state, window, replace=True)
            state.needs_recache = False

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
        mc = self.model.config
        prev = torch.stack(
            [
                r.prev
                if r.prev is not None
                else torch.zeros(mc.latent_channels, mc.latent_size, mc.latent_size)
                for r in records
            ]
        ).to(self.device)
        prev = prev[:, None].expand(-1, f, -1, -1, -1).to(self.config.dtype)
        prev_sigma = torch.tensor(
            [[self.config.ctx_sigma if r.prev is not None else 1.0] * f for r in records],
            device=self.device,
        )
        actions = torch.tensor([r.actions for r in records], device=self.device)
        txt = torch.stack([s.text for s in states]).to(self.device)[:, None].expand(-1, f, -1)
        pos = torch.tensor(
            [[r.position + i for i in range(f)] for r in records], device=self.device
        )
        return prev, prev_sigma, actions, txt, pos

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
        prev, prev_sigma, actions, txt, pos = self._inputs(states, records)
        latents = torch.stack([r.context for r in records]).to(self.device, cfg.dtype)
        sigma = torch.full(actions.shape, cfg.ctx_sigma, device=self.device)
        self.model(
            latents, prev, prev_sigma, sigma, actions, txt, pos, self._context(pages, contexts)
        )

    def _trim_history(self, state: WorldState) -> None:
        while len(state.history) > self.config.memory_chunks + (1 if self.config.sink else 0):
            state.history.popleft()

    def decode_latents(self, latents: torch.Tensor) -> np.ndarray:
        """Model-space latents ``(N, C, h, w)`` -> ``(N, H, W, 3)`` uint8 frames."""
        with torch.no_grad():
            flat = self.model.denormalize(latents.to(self.device).float())
            return (
                tensor_to_frames(self.ae.decoder(flat.to(self.config.dtype)).float().clamp(-1, 1))
                .cpu()
                .numpy()
            )

    def _generate_group(self, jobs: list[ChunkJob], decode: bool = True) -> list[ChunkResult]:
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
        records = [
            _ChunkRecord(None, s.history[-1].last_context_frame(), jobs[i].actions, s.position)
            for i, s in zip(live, states)
        ]
        contexts = [s.table.attended_pages() for s in states]
        candidates = [s.table.older_pages() for s in states]
        prev, prev_sigma, actions, txt, pos = self._inputs(states, records)
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
            return self.model(x.to(cfg.dtype), prev, prev_sigma, sig, actions, txt, pos, ctx)

        t0 = time.perf_counter()
        x0 = denoise(predict_x0, noise, jobs[live[0]].steps, cfg.shift)
        t1 = time.perf_counter()
        for r, lat in zip(records, x0):
            r.latents = lat.float().cpu() if self.device.type != "cpu" else lat.float()
        self._forward_fill(states, records, pages, contexts)
        for s, r, p in zip(states, records, pages):
            s.table.append_chunk(p)
            s.history.append(r)
            self._trim_history(s)
        t2 = time.perf_counter()
        if not decode:
            return [
                ChunkResult(None, {"denoise": (t1 - t0) * 1e3, "cache_fill": (t2 - t1) * 1e3})
                if res is None
                else res
                for res in results
            ]
        rgb = self.decode_latents(x0.reshape(-1, *x0.shape[2:]))
        rgb = rgb.reshape(len(live), f, self.height, self.width, 3)
        t3 = time.perf_counter()
        stages = {
            "denoise": (t1 - t0) * 1e3,
            "cache_fill": (t2 - t1) * 1e3,
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
