"""``WorldBackend`` for the Wan2.1 causal family (Self-Forcing, CausVid, LongLive base).

The shared runner (``engine.backends.runner``) with this family's parts: one KV pool
``[layers, pages, heads, page_size, head_dim]`` (one page = the tokens of one latent frame,
1560 at 832x480), a ``PageTable`` per session or branch, and per chunk of 3 latent frames:

1. denoise in 1-4 flow-matching steps (``engine.backends.sampler.denoise``, shift 5: the levels
   1, .9375, .833, .625 of Self-Forcing's warped t = 1000/750/500/250); the transformer
   predicts the flow ``noise - x0``; its self-attention reads the sink + window pages and
   writes the chunk's own;
2. cache fill: one more forward of the clean chunk labelled with ``ctx_sigma`` (0, as
   Self-Forcing) writes the keys/values later chunks attend;
3. streaming VAE decode with the session's causal feature cache (``engine.models.wan.vae_stream``).

Text: the UMT5 states of a prompt are computed once (diffusers ``WanPipeline.encode_prompt``)
and projected once per prompt (LRU cache); a prompt switch recaches the window (LongLive).

Actions are ignored: these are text-to-video models with no action input; steering is by
prompt only. The first chunk of a stream decodes to 9 frames (the Wan VAE maps the first
latent frame to one frame); its first frame is repeated so every chunk has 12 frames.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

import numpy as np
import torch

from worldstream.engine.backends import stages as shared
from worldstream.engine.backends.runner import (
    PagedAttentionContext,
    PagedRunner,
    RunnerState,
    StreamConfig,
)
from worldstream.engine.backends.stages import ChunkBatch, Stage
from worldstream.engine.core.backend import BackendInfo
from worldstream.engine.core.limits import check_keys, check_prompt
from worldstream.engine.core.reader import Check
from worldstream.engine.models.device import device_problem
from worldstream.engine.models.wan.loading import load_wan_parts
from worldstream.engine.models.wan.model import NUM_TRAIN_TIMESTEPS, WanChunkModel
from worldstream.engine.models.wan.vae_stream import (
    WanDecodeCache,
    decode_stream,
    denormalize_latents,
    new_decode_cache,
)

TEXT_TOKENS = 512  # UMT5 context length of Wan


@dataclass
class WanConfig(StreamConfig):
    """Streaming settings of the Wan causal backend (the shared ones: :class:`StreamConfig`,
    here with Self-Forcing's window, shift and context noise)."""

    # Self-Forcing's: 6 chunks = 18 frames + 3 = its 21-frame training context, its timestep
    # shift and clean context. NOTE: on a GPU, batching the sessions' forwards is where the
    # throughput comes from (TurboServe, StreamDiffusionV2): not batch-invariant, so a
    # stream's replay is bit-exact only while it shares no batch
    window_chunks: int = 6
    memory_chunks: int = 8
    shift: float = 5.0
    ctx_sigma: float = 0.0
    max_states: int = 2
    batch_invariant: bool = False
    height: int = 480
    """Video height in pixels (a multiple of 16)."""
    width: int = 832
    """Video width in pixels (a multiple of 16)."""
    latent_frames: int = 3
    """Latent frames per chunk (3 in the whole family), >= 1."""
    max_batch: int = 2
    """Rows per forward the working-set estimate assumes, >= 1."""
    text_cache: int = 64
    """Projected prompts kept (least recently used dropped), >= 1."""
    dtype: torch.dtype | None = None
    """Compute dtype (None: bf16 on CUDA, fp32 on a CPU)."""
    device: Annotated[str, Check(device_problem)] | None = None
    """torch device (None: CUDA where there is one)."""
    fps: int = 16
    """Default playback rate (Wan generates 16 fps)."""

    def __post_init__(self):
        super().__post_init__()
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
        if self.max_batch < 1 or self.text_cache < 1:
            raise ValueError("max_batch and text_cache must be >= 1")


@dataclass
class _WanChunk:
    latents: torch.Tensor | None  # (C, F, h, w) clean model-space latents
    position: int  # latent-frame index of its first frame
    context: torch.Tensor | None = None  # what the cache fill consumed

    @property
    def num_frames(self) -> int:
        return self.latents.shape[1]


@dataclass
class WanState(RunnerState):
    """One session's (or branch's) state: the shared ones (``text``: ``(512, inner_dim)``
    projected prompt) plus the VAE decoder's causal feature cache."""

    decode: WanDecodeCache = field(default_factory=WanDecodeCache)


def _plan(backend: WanBackend, batch: ChunkBatch) -> None:
    """Stage: a record per chunk (actions are ignored)."""
    batch.records = [_WanChunk(None, s.position) for s in batch.states]


def show_stream(backend, batch: ChunkBatch) -> None:
    """Stage: stream-decode each state's new chunk: ``chunk_frames`` uint8 ``(T, H, W, 3)``
    (any backend with ``vae``, ``vae_dtype``, ``chunk_frames`` and states with a ``decode``
    cache: the Wan family and Matrix-Game)."""
    states = batch.states
    out: list[np.ndarray | None] = [None] * len(states)
    lat = denormalize_latents(backend.vae, batch.x0.float()).to(backend.vae_dtype)
    phases = [[n for n, s in enumerate(states) if s.decode.started == started]
              for started in (False, True)]  # split before decoding: it starts streams
    for rows in filter(None, phases):
        video = decode_stream(backend.vae, lat[rows], [states[n].decode for n in rows])
        if video.shape[2] < backend.chunk_frames:  # a stream's first chunk
            pad = backend.chunk_frames - video.shape[2]
            video = torch.cat([video[:, :, :1].expand(-1, -1, pad, -1, -1), video], 2)
        rgb = ((video.float() + 1.0) * 127.5).round().clamp(0, 255).to(torch.uint8)
        rgb = rgb.permute(0, 2, 3, 4, 1).cpu().numpy()
        for k, n in enumerate(rows):
            out[n] = rgb[k]
    batch.frames = out


class WanBackend(PagedRunner):
    """``engine.core.backend.WorldBackend`` over a causal Wan transformer, its VAE and a
    prompt encoder ``encode(prompt) -> (512, text_dim)`` (UMT5 states): the shared
    :class:`~engine.backends.runner.PagedRunner` plus the text projection and the streaming
    VAE decode.

    Actions are ignored (text-to-video: no action input); ``len(job.actions)`` only gives the
    chunk length, which must be ``chunk_frames``.
    """

    name = "wan-causal"

    def info(self) -> BackendInfo:
        """A landscape of text alone (its actions are ignored), one chunk size."""
        return self.runner_info(world="landscape",
                                supported_chunk_frames=self.supported_chunk_frames)
    #: one chunk's path (``engine.backends.stages``)
    stages = (
        Stage("plan", _plan),
        Stage("select_pages", shared.select_pages),
        Stage("condition", shared.condition),
        Stage("noise", shared.noise),
        Stage("denoise", shared.denoise, "denoise"),
        Stage("show", show_stream, "decode"),
    )

    def __init__(self, transformer, vae, encode_text, config: WanConfig | None = None):
        cfg = config or WanConfig()
        model = WanChunkModel(transformer)
        spatial = 2 ** (len(vae.config.dim_mult) - 1)
        latent_shape = (vae.config.z_dim, cfg.latent_frames, cfg.height // spatial,
                        cfg.width // spatial)
        page_size = model.tokens_per_frame(*latent_shape[2:])
        super().__init__(cfg, pages_per_chunk=cfg.latent_frames,
                         pool_shape=(model.num_layers, model.num_heads, page_size,
                                     model.head_dim),
                         dtype=cfg.dtype, device=torch.device(cfg.device))
        self.config: WanConfig = cfg
        self.model = model
        self.vae = vae
        self.vae_dtype = next(vae.parameters()).dtype
        self.encode_text = encode_text
        self.width, self.height = cfg.width, cfg.height
        self.default_fps = cfg.fps
        temporal = 2 ** list(vae.config.temperal_downsample).count(True)  # 4 frames per latent
        self.chunk_frames = cfg.latent_frames * temporal
        self.supported_chunk_frames = (self.chunk_frames,)
        self.latent_shape = latent_shape
        self.page_size = page_size
        self._text_cache: OrderedDict[str, torch.Tensor] = OrderedDict()
        self._text_lock = threading.Lock()  # prompts are encoded off the engine thread

    def key_action(self, keys: frozenset[str]) -> int:
        """Always 0: the model takes no actions (keys are checked, then ignored)."""
        check_keys(keys)
        return 0

    # -- text ----------------------------------------------------------------------------
    def _project(self, prompt: str) -> torch.Tensor:
        key = check_prompt(prompt)
        with self._text_lock:
            if key in self._text_cache:
                self._text_cache.move_to_end(key)
                return self._text_cache[key]
            states = self.encode_text(key).to(self.device)
            text = self.model.project_text(states[None])[0]
            self._text_cache[key] = text
            if len(self._text_cache) > self.config.text_cache:
                self._text_cache.popitem(last=False)
            return text

    def _embed(self, text: str, blend_text: str | None, weight: float) -> torch.Tensor:
        if not 0.0 <= weight <= 1.0:
            raise ValueError(f"blend weight must be in [0, 1], got {weight}")
        base = self._project(text)
        if blend_text is None or weight == 0.0:
            return base
        # NOTE: the projection is affine-then-GELU, so blending after it is not the projection
        # of blended UMT5 states; both prompts stay cached and this keeps a switch cheap.
        return (1.0 - weight) * base + weight * self._project(blend_text)

    # -- state lifecycle -----------------------------------------------------------------
    def _make_state(self, table, prompt, text, rng) -> WanState:
        return WanState(table, prompt, text, rng, decode=new_decode_cache(self.vae))

    def _fork_state(self, state: WanState, table, rng) -> WanState:
        return WanState(table, state.prompt, state.text, rng, deque(state.history),
                        state.needs_recache, attention=state.attention,
                        decode=state.decode.snapshot())

    def free(self, state: WanState) -> None:
        """Release the state's pages and its decoder cache. Idempotent."""
        super().free(state)
        state.decode = WanDecodeCache()

    def _after_rewind(self, state: WanState) -> None:
        """The decoder's causal cache is rebuilt by decoding the retained chunks again: exact
        while the stream's first chunk is retained, a warm start from the oldest retained
        chunk after that."""
        redecode(self, state)

    # -- a chunk -------------------------------------------------------------------------
    def noise(self, generator: torch.Generator) -> torch.Tensor:
        return torch.randn(self.latent_shape, generator=generator)

    def conditioning(self, states: list[WanState], records: list[_WanChunk]) -> tuple:
        return torch.stack([s.text for s in states]), [r.position for r in records]

    def forward(self, x, sigma: float, cond: tuple, ctx: PagedAttentionContext) -> torch.Tensor:
        """Flow prediction of a batch of chunks ``x`` ``(B, C, F, h, w)`` at noise ``sigma``
        under texts ``(B, 512, inner_dim)``, first frames at the records' positions."""
        texts, starts = cond
        t = torch.full((x.shape[0],), sigma * NUM_TRAIN_TIMESTEPS, device=self.device)
        return self.model.forward_chunk(x, t, texts, torch.tensor(starts), ctx).float()

    def to_x0(self, x: torch.Tensor, sigma: float, out: torch.Tensor) -> torch.Tensor:
        return x - sigma * out  # the transformer predicts the flow noise - x0


def redecode(backend, state) -> None:
    """A fresh decoder cache for ``state``, warmed by decoding its retained chunks again
    (after a rewind; shared with Matrix-Game)."""
    state.decode = new_decode_cache(backend.vae)
    if state.history:
        lat = torch.stack([c.latents for c in state.history], 0)  # (N, C, F, h, w)
        lat = lat.permute(1, 0, 2, 3, 4).flatten(1, 2)[None].to(backend.device)
        decode_stream(backend.vae, denormalize_latents(backend.vae, lat).to(backend.vae_dtype),
                      [state.decode])


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
    pool = (2 * transformer_config["num_layers"] * cfg.pages_per_state(cfg.latent_frames) *
    cfg.max_states
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


def load_wan_backend(model_path: str | Path | None = None,
                     checkpoint: str | Path | None = None, **kwargs) -> WanBackend:
    """The Wan causal backend from a local directory (layout: ``engine.models.wan.loading``).

    ``checkpoint``: the causal generator file (default ``DIR/causal.{safetensors,pt,pth}``);
    ``kwargs`` go to :class:`WanConfig`. Raises FileNotFoundError naming a missing file,
    ValueError (dtype, config), KeyConversionError (unmatched checkpoint keys),
    InsufficientMemoryError (estimated before loading).
    """
    from worldstream.engine.models.wan.loading import check_layout, read_config

    if model_path is None:
        raise ValueError("model wan-causal needs --model-path DIR: the diffusers-format "
                         "Wan2.1-T2V-1.3B base plus the causal checkpoint")
    cfg = WanConfig(**kwargs)
    path = Path(model_path)
    check_layout(path)
    extra = estimate_extra_bytes(read_config(path / "transformer"), read_config(path / "vae"),
                                 cfg)
    device = torch.device(cfg.device)
    parts = load_wan_parts(path, checkpoint, cfg.dtype, device, extra)
    encode = pipeline_text_encoder(parts.tokenizer, parts.text_encoder, parts.vae, device,
                                   cfg.dtype)
    return WanBackend(parts.transformer, parts.vae, encode, cfg)
