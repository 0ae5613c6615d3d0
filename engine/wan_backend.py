"""``WorldBackend`` for the Wan2.1 causal family (Self-Forcing, CausVid, LongLive base).

Same pattern as the built-in model (``engine.generator``): one preallocated KV pool
``[layers, pages, heads, page_size, head_dim]`` (one page = the tokens of one latent frame,
1560 at 832x480), a ``PageTable`` per session or branch, and per chunk of 3 latent frames:

1. denoise in 1-4 flow-matching steps (``engine.sampler.denoise``, shift 5: the levels
   1, .9375, .833, .625 of Self-Forcing's warped t = 1000/750/500/250); the transformer
   predicts the flow ``noise - x0``; its self-attention reads the sink + window pages and
   writes the chunk's own;
2. cache fill: one more forward of the clean chunk labelled with ``ctx_sigma`` (0, as
   Self-Forcing) writes the keys/values later chunks attend;
3. streaming VAE decode with the session's causal feature cache (``wan_vae_stream``).

Text: the UMT5 states of a prompt are computed once (diffusers ``WanPipeline.encode_prompt``)
and projected once per prompt (LRU cache); a prompt switch recaches the window (LongLive).

Actions are ignored: these are text-to-video models with no action input; steering is by
prompt only. The first chunk of a stream decodes to 9 frames (the Wan VAE maps the first
latent frame to one frame); its first frame is repeated so every chunk has 12 frames.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from worldstream import kernels
from worldstream.engine.api import CapacityError
from worldstream.engine.backend import ChunkJob, ChunkResult, StateBudget
from worldstream.engine.generator import PagedAttentionContext
from worldstream.engine.kv_cache import PageAllocator, PageTable, allocate_chunks
from worldstream.engine.models.wan import NUM_TRAIN_TIMESTEPS, WanChunkModel
from worldstream.engine.models.wan_loading import load_wan_parts
from worldstream.engine.models.wan_vae_stream import (
    WanDecodeCache,
    decode_stream,
    denormalize_latents,
    new_decode_cache,
)
from worldstream.engine.sampler import denoise, fork_rng
from worldstream.engine.text import MAX_PROMPT_CHARS

TEXT_TOKENS = 512  # UMT5 context length of Wan


@dataclass
class WanConfig:
    """Streaming settings of the Wan causal backend.

    ``height``/``width``: video size in pixels (multiples of 16). ``latent_frames``: latent
    frames per chunk (3 in the whole family). ``window_chunks``: chunks always attended besides
    the current one (6: 18 frames + 3 = Self-Forcing's 21-frame training context).
    ``sink``: keep the first chunk attended (LongLive). ``memory_chunks``: chunks retained
    (>= window; the extra ones are rewind history). ``shift``: sampler shift (5, Self-Forcing).
    ``ctx_sigma``: noise level the cache fill labels the context with. ``max_states``: sessions +
    branches the pool is sized for. ``max_batch``: rows per forward the working-set estimate
    assumes. ``recache``: recompute the window under a new prompt. ``text_cache``: projected
    prompts kept (LRU). ``dtype``/``device``: None picks bf16 on CUDA, fp32 on CPU.
    ``attention_backend``: ``kernels.paged_attention`` backend. ``fps``: default playback rate
    (Wan generates 16 fps video).
    """

    height: int = 480
    width: int = 832
    latent_frames: int = 3
    window_chunks: int = 6
    sink: bool = False
    memory_chunks: int = 8
    shift: float = 5.0
    ctx_sigma: float = 0.0
    max_states: int = 2
    max_batch: int = 2
    recache: bool = True
    text_cache: int = 64
    dtype: torch.dtype | None = None
    device: str | None = None
    attention_backend: str = "auto"
    fps: int = 16

    def __post_init__(self):
        if self.device is None:
            self.device = "cuda" if torch.cuda.is_available() else "cpu"
        if self.dtype is None:
            self.dtype = torch.bfloat16 if torch.device(self.device).type == "cuda" \
                else torch.float32
        if self.height % 16 or self.width % 16 or self.height < 16 or self.width < 16:
            raise ValueError(f"height and width must be positive multiples of 16, "
                             f"got {self.height}x{self.width}")
        if self.latent_frames < 1:
            raise ValueError("latent_frames must be >= 1")
        if self.window_chunks < 1 or self.memory_chunks < self.window_chunks:
            raise ValueError("need 1 <= window_chunks <= memory_chunks")
        if not 0.0 <= self.ctx_sigma < 1.0:
            raise ValueError(f"ctx_sigma must be in [0, 1), got {self.ctx_sigma}")
        if self.max_states < 1 or self.max_batch < 1 or self.text_cache < 1:
            raise ValueError("max_states, max_batch and text_cache must be >= 1")

    def pages_per_state(self) -> int:
        """Latent-frame pages one state may hold: sink + retained chunks + the chunk being
        generated + a recache copy of the window."""
        return self.latent_frames * ((1 if self.sink else 0) + self.memory_chunks + 1
                                     + self.window_chunks)


@dataclass
class _WanChunk:
    latents: torch.Tensor  # (C, F, h, w) clean model-space latents
    position: int          # latent-frame index of its first frame


@dataclass
class WanState:
    """One session's (or branch's) state."""

    table: PageTable
    prompt: str
    text: torch.Tensor            # (512, inner_dim) projected prompt
    rng: torch.Generator
    decode: WanDecodeCache
    history: deque = field(default_factory=deque)  # _WanChunk, newest last
    needs_recache: bool = False
    freed: bool = False

    @property
    def position(self) -> int:
        if not self.history:
            return 0
        last = self.history[-1]
        return last.position + last.latents.shape[1]


class _PoolDeviceContext(PagedAttentionContext):
    """The generator's paged context with its CSR page lists on the pool's device
    (``kernels.paged_attention`` refuses tensors on mixed devices; the base class builds them
    on the CPU)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._csr = tuple(t.to(self.k_pool.device) for t in self._csr)


class WanCausalBackend:
    """``engine.backend.WorldBackend`` over a causal Wan transformer, its VAE and a prompt
    encoder ``encode(prompt) -> (512, text_dim)`` (UMT5 states).

    Actions are ignored (text-to-video: no action input); ``len(job.actions)`` only gives the
    chunk length, which must be ``chunk_frames``.
    """

    name = "wan-causal"

    def __init__(self, transformer, vae, encode_text, config: WanConfig | None = None):
        self.config = cfg = config or WanConfig()
        self.device = torch.device(cfg.device)
        self.model = WanChunkModel(transformer)
        self.vae = vae
        self.vae_dtype = next(vae.parameters()).dtype
        self.encode_text = encode_text
        self.width, self.height = cfg.width, cfg.height
        self.default_fps = cfg.fps
        self.max_states = cfg.max_states
        self.rewind_chunks = cfg.memory_chunks - cfg.window_chunks
        temporal = 2 ** list(vae.config.temperal_downsample).count(True)  # 4 frames per latent
        self.chunk_frames = cfg.latent_frames * temporal
        self.supported_chunk_frames = (self.chunk_frames,)
        spatial = 2 ** (len(vae.config.dim_mult) - 1)
        self.latent_shape = (vae.config.z_dim, cfg.latent_frames, cfg.height // spatial,
                             cfg.width // spatial)
        self.page_size = self.model.tokens_per_frame(*self.latent_shape[2:])
        num_pages = cfg.pages_per_state() * cfg.max_states
        self.allocator = PageAllocator(num_pages)
        shape = (self.model.num_layers, num_pages, self.model.num_heads, self.page_size,
                 self.model.head_dim)
        self.k_pool = torch.zeros(shape, dtype=cfg.dtype, device=self.device)
        self.v_pool = torch.zeros(shape, dtype=cfg.dtype, device=self.device)
        self.attention_backend = kernels.resolve_backend(cfg.attention_backend, self.device)
        self._text_cache: OrderedDict[str, torch.Tensor] = OrderedDict()
        self._lock = threading.RLock()
        self._budget = StateBudget(cfg.max_states)

    # -- text ----------------------------------------------------------------------------
    def _project(self, prompt: str) -> torch.Tensor:
        if not isinstance(prompt, str) or not prompt.strip():
            raise ValueError("prompt must be a non-empty string")
        if len(prompt) > MAX_PROMPT_CHARS:
            raise ValueError(f"prompt is {len(prompt)} characters; the limit is "
                             f"{MAX_PROMPT_CHARS}")
        key = prompt.strip()
        if key in self._text_cache:
            self._text_cache.move_to_end(key)
            return self._text_cache[key]
        states = self.encode_text(key).to(self.device)
        text = self.model.project_text(states[None])[0]
        self._text_cache[key] = text
        if len(self._text_cache) > self.config.text_cache:
            self._text_cache.popitem(last=False)
        return text

    def _text(self, text: str, blend_text: str | None, weight: float) -> torch.Tensor:
        if not 0.0 <= weight <= 1.0:
            raise ValueError(f"blend weight must be in [0, 1], got {weight}")
        base = self._project(text)
        if blend_text is None or weight == 0.0:
            return base
        # NOTE: the projection is affine-then-GELU, so blending after it is not the projection
        # of blended UMT5 states; both prompts stay cached and this keeps a switch cheap.
        return (1.0 - weight) * base + weight * self._project(blend_text)

    # -- state lifecycle -----------------------------------------------------------------
    def new_state(self, prompt: str, seed: int) -> WanState:
        """A stream of ``prompt`` starting from noise. ValueError for a bad prompt,
        CapacityError when ``max_states`` states are live."""
        with self._lock:
            text = self._project(prompt)
            self._budget.reserve()
            cfg = self.config
            table = PageTable(self.allocator, pages_per_chunk=cfg.latent_frames,
                              window_chunks=cfg.window_chunks, sink=cfg.sink,
                              max_chunks=cfg.memory_chunks)
            return WanState(table, prompt, text, torch.Generator().manual_seed(seed),
                            new_decode_cache(self.vae))

    def set_prompt(self, state: WanState, text: str, blend_text: str | None = None,
                   blend_weight: float = 0.0) -> None:
        """Switch the prompt from the next chunk on; the window is recached under it first."""
        with self._lock:
            emb = self._text(text, blend_text, blend_weight)
            state.prompt, state.text = text, emb
            state.needs_recache = self.config.recache and bool(state.history)

    def fork(self, state: WanState) -> WanState:
        with self._lock:
            self._budget.reserve()
            return WanState(state.table.fork(), state.prompt, state.text, fork_rng(state.rng),
                            state.decode.snapshot(), deque(state.history),
                            state.needs_recache)

    def free(self, state: WanState) -> None:
        with self._lock:
            if not state.freed:
                state.table.free()
                state.freed = True
                state.decode = WanDecodeCache()
                self._budget.release()

    def rewind(self, state: WanState, chunks: int) -> None:
        """Drop the newest ``chunks`` chunks. The decoder's causal cache is rebuilt by decoding
        the retained chunks again: exact while the stream's first chunk is retained, a warm
        start from the oldest retained chunk after that. ValueError beyond the history."""
        with self._lock:
            limit = min(len(state.history) - 1, state.table.max_rewind())
            if not isinstance(chunks, int) or not 0 <= chunks <= max(limit, 0):
                raise ValueError(f"cannot rewind {chunks!r} chunks; {max(limit, 0)} are kept")
            state.table.rewind(chunks)
            for _ in range(chunks):
                state.history.pop()
            state.decode = new_decode_cache(self.vae)
            if state.history:
                lat = torch.stack([c.latents for c in state.history], 0)  # (N, C, F, h, w)
                lat = lat.permute(1, 0, 2, 3, 4).flatten(1, 2)[None].to(self.device)
                decode_stream(self.vae, denormalize_latents(self.vae, lat).to(self.vae_dtype),
                              [state.decode])

    # -- generation ----------------------------------------------------------------------
    @torch.no_grad()
    def generate(self, jobs: list[ChunkJob]) -> list[ChunkResult]:
        """One chunk per job, batched by step count; per-job failures come back as
        ``ChunkResult.error`` and leave the other jobs' results valid."""
        results: list[ChunkResult | None] = [None] * len(jobs)
        with self._lock:
            groups: dict[int, list[int]] = {}
            for i, job in enumerate(jobs):
                try:
                    self._validate(job)
                    if job.state.needs_recache:
                        self._recache(job.state)
                    groups.setdefault(job.steps, []).append(i)
                except Exception as err:  # isolate this job's failure
                    results[i] = ChunkResult(None, error=err)
            for idx in groups.values():
                for i, res in zip(idx, self._generate_group([jobs[i] for i in idx]), strict=True):
                    results[i] = res
        return results

    def _validate(self, job: ChunkJob) -> None:
        if job.state.freed:
            raise ValueError("state was freed")
        if job.num_frames != self.chunk_frames:
            raise ValueError(f"this model generates chunks of {self.chunk_frames} frames, "
                             f"got {job.num_frames}")
        if not 1 <= job.steps <= 4:
            raise ValueError(f"steps must be in [1, 4], got {job.steps}")

    def _context(self, pages, contexts) -> PagedAttentionContext:
        new = torch.tensor([p for ps in pages for p in ps], device=self.device)
        always = [c + p for c, p in zip(contexts, pages, strict=True)]
        return _PoolDeviceContext(self.k_pool, self.v_pool, new, always,
                                  [[] for _ in pages], 0, self.attention_backend)

    def _forward(self, x, sigma: float, texts, starts: list[int], ctx) -> torch.Tensor:
        """Flow prediction of a batch of chunks ``x`` ``(B, C, F, h, w)`` at noise ``sigma``
        under ``texts`` ``(B, 512, inner_dim)``, first frames at ``starts``."""
        t = torch.full((x.shape[0],), sigma * NUM_TRAIN_TIMESTEPS, device=self.device)
        return self.model.forward_chunk(x, t, texts, torch.tensor(starts), ctx).float()

    def _cache_fill(self, latents, texts, starts, pages, contexts) -> None:
        self._forward(latents, self.config.ctx_sigma, texts, starts,
                      self._context(pages, contexts))

    def _recache(self, state: WanState) -> None:
        """Recompute the window's keys/values under the new text into fresh pages and swap
        them in (copy-on-write: a fork sharing the old pages keeps them)."""
        f = self.config.latent_frames
        window = state.table.window_pages()
        num_chunks = len(window) // f
        records = list(state.history)[-num_chunks:] if num_chunks else []
        for n, rec in enumerate(records):
            pages = self.allocator.allocate(f)
            if pages is None:
                raise CapacityError("KV page pool exhausted", 2.0)
            old = window[n * f:(n + 1) * f]
            context = state.table.sink_pages() + window[:n * f]
            self._cache_fill(rec.latents[None].to(self.device), state.text[None],
                             [rec.position], [pages], [context])
            for o, p in zip(old, pages, strict=True):
                state.table.replace_page(o, p)
            window[n * f:(n + 1) * f] = pages
        state.needs_recache = False

    def _generate_group(self, jobs: list[ChunkJob]) -> list[ChunkResult]:
        cfg, f = self.config, self.config.latent_frames
        live, pages = allocate_chunks(self.allocator, len(jobs), f)
        short = CapacityError("KV page pool exhausted", 2.0)
        results: list[ChunkResult | None] = [
            None if i in live else ChunkResult(None, error=short) for i in range(len(jobs))
        ]
        if not live:
            return results
        states = [jobs[i].state for i in live]
        contexts = [s.table.attended_pages() for s in states]
        noise = torch.stack([
            torch.randn(self.latent_shape, generator=(
                torch.Generator().manual_seed(jobs[i].seed) if jobs[i].seed is not None
                else s.rng)) for i, s in zip(live, states, strict=True)]).to(self.device)
        ctx = self._context(pages, contexts)
        texts = torch.stack([s.text for s in states])
        starts = [s.position for s in states]

        def predict_x0(x, sigma):
            return x - sigma * self._forward(x, sigma, texts, starts, ctx)

        t0 = time.perf_counter()
        x0 = denoise(predict_x0, noise, jobs[live[0]].steps, cfg.shift)
        t1 = time.perf_counter()
        self._cache_fill(x0, texts, starts, pages, contexts)
        for s, lat, p, start in zip(states, x0, pages, starts, strict=True):
            s.table.append_chunk(p)
            s.history.append(_WanChunk(lat.float(), start))
            while len(s.history) > cfg.memory_chunks + (1 if cfg.sink else 0):
                s.history.popleft()
        t2 = time.perf_counter()
        frames = self._decode(states, x0)
        t3 = time.perf_counter()
        stages = {"denoise": (t1 - t0) * 1e3, "cache_fill": (t2 - t1) * 1e3,
                  "decode": (t3 - t2) * 1e3}
        for n, i in enumerate(live):
            results[i] = ChunkResult(frames[n], dict(stages))
        return results

    def _decode(self, states, x0) -> list[np.ndarray]:
        """Stream-decode each state's new chunk: ``chunk_frames`` uint8 ``(T, H, W, 3)``."""
        out: list[np.ndarray | None] = [None] * len(states)
        lat = denormalize_latents(self.vae, x0.float()).to(self.vae_dtype)
        phases = [[n for n, s in enumerate(states) if s.decode.started == started]
                  for started in (False, True)]  # split before decoding: it starts streams
        for rows in filter(None, phases):
            video = decode_stream(self.vae, lat[rows], [states[n].decode for n in rows])
            if video.shape[2] < self.chunk_frames:  # a stream's first chunk
                pad = self.chunk_frames - video.shape[2]
                video = torch.cat([video[:, :, :1].expand(-1, -1, pad, -1, -1), video], 2)
            rgb = ((video.float() + 1.0) * 127.5).round().clamp(0, 255).to(torch.uint8)
            rgb = rgb.permute(0, 2, 3, 4, 1).cpu().numpy()
            for k, n in enumerate(rows):
                out[n] = rgb[k]
        return out


def pipeline_text_encoder(tokenizer, text_encoder, vae, device, dtype):
    """``encode(prompt) -> (512, text_dim)``: diffusers ``WanPipeline.encode_prompt`` (prompt
    cleaning, tokenisation to 512 tokens, UMT5, zeroed padding), without guidance."""
    from diffusers import FlowMatchEulerDiscreteScheduler, WanPipeline

    pipe = WanPipeline(tokenizer=tokenizer, text_encoder=text_encoder, vae=vae,
                       scheduler=FlowMatchEulerDiscreteScheduler())

    def encode(prompt: str) -> torch.Tensor:
        embeds, _ = pipe.encode_prompt(prompt, do_classifier_free_guidance=False,
                                       max_sequence_length=TEXT_TOKENS, device=device,
                                       dtype=dtype)
        return embeds[0]

    return encode


def estimate_extra_bytes(transformer_config: dict, vae_config: dict, cfg: WanConfig) -> dict:
    """Bytes the backend allocates besides the weights: the KV pool, the decoders' causal
    caches (2 per state: live + a fork's) and a working set (forward activations of
    ``max_batch`` chunks, decoder activations taken as twice its cache)."""
    from diffusers import AutoencoderKLWan

    elem = torch.empty((), dtype=cfg.dtype).element_size()
    heads, head_dim = (transformer_config["num_attention_heads"],
                       transformer_config["attention_head_dim"])
    inner = heads * head_dim
    patch = transformer_config.get("patch_size", (1, 2, 2))
    spatial = 2 ** (len(vae_config.get("dim_mult", [1, 2, 4, 4])) - 1)
    h, w = cfg.height // spatial, cfg.width // spatial
    page = (h // patch[1]) * (w // patch[2])
    pool = (2 * transformer_config["num_layers"] * cfg.pages_per_state() * cfg.max_states
            * heads * page * head_dim * elem)
    with torch.device("meta"):  # shapes only: run the decoder on meta tensors
        vae = AutoencoderKLWan.from_config(vae_config)
        cache = new_decode_cache(vae)
        for _ in range(2):
            decode_stream(vae, torch.zeros(1, vae.config.z_dim, 1, h, w), [cache])
    cache_bytes = sum(e.numel() for e in cache.entries if isinstance(e, torch.Tensor)) * elem
    tokens = cfg.latent_frames * page * cfg.max_batch
    activations = tokens * (transformer_config["ffn_dim"] + 8 * inner) * elem
    return {"kv_pool": pool, "decode_caches": 2 * cfg.max_states * cache_bytes,
            "working_set": activations + 2 * cfg.max_batch * cache_bytes}


def load_wan_backend(model_path: str | Path, checkpoint: str | Path | None = None,
                     **kwargs) -> WanCausalBackend:
    """The Wan causal backend from a local directory (layout: ``engine.models.wan_loading``).

    ``checkpoint``: the causal generator file (default ``DIR/causal.{safetensors,pt,pth}``);
    ``kwargs`` go to :class:`WanConfig`. Raises FileNotFoundError naming a missing file,
    ValueError (dtype, config), KeyConversionError (unmatched checkpoint keys),
    InsufficientMemoryError (estimated before loading).
    """
    from worldstream.engine.models.wan_loading import check_layout, read_config

    cfg = WanConfig(**kwargs)
    path = Path(model_path)
    check_layout(path)
    extra = estimate_extra_bytes(read_config(path / "transformer"), read_config(path / "vae"),
                                 cfg)
    device = torch.device(cfg.device)
    parts = load_wan_parts(path, checkpoint, cfg.dtype, device, extra)
    encode = pipeline_text_encoder(parts.tokenizer, parts.text_encoder, parts.vae, device,
                                   cfg.dtype)
    return WanCausalBackend(parts.transformer, parts.vae, encode, cfg)
