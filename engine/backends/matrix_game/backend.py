"""``WorldBackend`` for Matrix-Game 2.0 (``--model matrix-game-2 --variant universal|gta_drive|
templerun``): keys and mouse steer an image-to-world causal DiT, chunk by chunk.

The shared runner (``engine.backends.runner``) with this family's parts: one page per latent
frame (880 tokens at 352x640) in the KV pool, and beside it the action modules' keys/values in
pools indexed by the same pages (:mod:`engine.backends.matrix_game.attention`), so a session's
page table forks, rewinds and frees both. Per chunk of 3 latent frames (12 video frames; a
stream's first decodes to 9, its first frame shown 4 times):

1. plan: the latent frames' action windows (12 raw frames of keys and mouse each, left-padded
   on the stream's first chunk) from the job's per-frame controls (``action_space``);
2. the attention window: the variant's ``local_attn_size`` latent frames, the chunk's own
   included (universal, Temple Run: 6; GTA: 4), no sink;
3. denoise at the variant's distilled steps warped with shift 5 (Temple Run has 4), fresh
   noise between them; the cache fill (one forward at t = 0) after delivery;
4. decode with the Wan VAE's causal feature cache (``engine.models.wan.vae_stream``).

The world starts from a picture (``POST /api/sessions/{id}/picture``; else a plain horizon):
its CLIP tokens are the cross-attention context and its VAE latents the 20 condition channels.
There is no text prompt (a prompt switch is refused). A save point holds the state's KV and
action pages, the picture's conditioning, the retained chunks, the decoder cache and the RNG
(:mod:`engine.backends.matrix_game.savestate`); at full size a state (216 MB a latent frame in
bf16) passes the save file limit and is refused with its size.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict, deque
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import torch

from worldstream.engine.backends import stages as shared
from worldstream.engine.backends.matrix_game import stages as mg
from worldstream.engine.backends.matrix_game.attention import ActionPools, MatrixGameAttention
from worldstream.engine.backends.matrix_game.savestate import MatrixGameSaves
from worldstream.engine.backends.matrix_game.state import MatrixGameState
from worldstream.engine.backends.runner import PagedAttentionContext, PagedRunner
from worldstream.engine.backends.stages import Stage
from worldstream.engine.backends.stream_config import StreamConfig
from worldstream.engine.backends.wan.backend import redecode, show_stream
from worldstream.engine.core.action_space import ActionSpace
from worldstream.engine.core.backend import BackendInfo
from worldstream.engine.core.kv_cache import PageTable
from worldstream.engine.core.limits import check_prompt
from worldstream.engine.core.reader import Check
from worldstream.engine.models.device import device_problem
from worldstream.engine.models.matrix_game.config import MatrixGameConfig, get_variant
from worldstream.engine.models.matrix_game.transformer import (
    NUM_TRAIN_TIMESTEPS,
    MatrixGameChunkModel,
)
from worldstream.engine.models.wan.vae_stream import WanDecodeCache, new_decode_cache


@dataclass
class MatrixGameBackendConfig(StreamConfig):
    """Streaming settings of Matrix-Game 2.0 (the shared ones: :class:`StreamConfig`, here
    with the published model's shift, clean context and no recache: there is no prompt)."""

    # NOTE: one previous chunk covers the local window of every variant (<= 6 frames); the
    # runner attends only its last local_attn_size - 3 frames
    window_chunks: int = 1
    memory_chunks: int = 4
    shift: float = 5.0
    ctx_sigma: float = 0.0
    ctx_noise: bool = False
    recache: bool = False
    max_states: int = 2
    batch_invariant: bool = False
    variant: str = "universal"
    """universal (WASD + mouse look), gta_drive (W/S + A/D steering) or templerun."""
    height: int = 352
    """Video height in pixels (a multiple of 16; the model was trained at 352)."""
    width: int = 640
    """Video width in pixels (a multiple of 16; trained at 640)."""
    latent_frames: int = 3
    """Latent frames per chunk (the published model's 3)."""
    cond_frames: int = 21
    """Latent frames of the start picture's condition encoded (later frames repeat the
    last), >= 2."""
    mouse_sensitivity: float = 0.01
    """Camera turn per pixel of mouse motion, model units: a chunk's D pixels over its F
    frames turn it D * mouse_sensitivity / F a frame (a held look key: 0.1 a frame)."""
    mouse_limit: float = 0.25
    """The largest mouse velocity per frame, model units (the camera keys give 0.1)."""
    start_image: str | None = None
    """A PNG/JPEG the world starts from (None: a plain horizon)."""
    dtype: torch.dtype | None = None
    """Compute dtype (None: bf16 on CUDA, fp32 on a CPU)."""
    device: Annotated[str, Check(device_problem)] | None = None
    """torch device (None: CUDA where there is one)."""
    fps: int = 25
    """Default playback rate (the model's 25 fps)."""

    def __post_init__(self):
        super().__post_init__()
        get_variant(self.variant)  # ValueError naming the variants
        if self.device is None:
            self.device = "cuda" if torch.cuda.is_available() else "cpu"
        if self.dtype is None:
            self.dtype = torch.bfloat16 if torch.device(self.device).type == "cuda" \
                else torch.float32
        if self.height % 16 or self.width % 16 or min(self.height, self.width) < 16:
            raise ValueError(f"height and width must be positive multiples of 16, "
                             f"got {self.height}x{self.width}")
        if self.latent_frames < 1 or self.cond_frames < 2:
            raise ValueError("need latent_frames >= 1 and cond_frames >= 2")
        if not self.mouse_sensitivity > 0 or not self.mouse_limit > 0:
            raise ValueError("mouse_sensitivity and mouse_limit must be > 0")


class MatrixGameBackend(PagedRunner, MatrixGameSaves):
    """``engine.core.backend.WorldBackend`` over a Matrix-Game 2.0 DiT
    (:func:`~engine.models.matrix_game.transformer.build_transformer` with weights), its
    ``model_config``, the Wan VAE (``AutoencoderKLWan``) and the CLIP image encoder.
    ``name``: ``matrix-game-2:<variant>`` (what input logs record)."""

    world = "game"  # the page: the variant's controls, no prompt box
    starts_from_frames = True  # the picture start of engine.studio.worldio

    def info(self) -> BackendInfo:
        """Its variant's keys (and mouse) as a game's page, one chunk size, a picture start."""
        return self.runner_info(world=self.world,
                                supported_chunk_frames=self.supported_chunk_frames,
                                action_space=self.action_space, wire_keys=self.wire_keys,
                                controls=self.controls, starts_from_frames=True)
    stages = (
        Stage("plan", mg.plan),
        Stage("select_pages", shared.select_pages),
        Stage("condition", shared.condition),
        Stage("noise", mg.noise),
        Stage("denoise", mg.denoise, "denoise"),
        Stage("show", show_stream, "decode"),
    )

    def __init__(self, transformer, model_config: MatrixGameConfig, vae, image_encoder,
                 config: MatrixGameBackendConfig | None = None):
        cfg = config or MatrixGameBackendConfig()
        self.variant = get_variant(cfg.variant)
        model = MatrixGameChunkModel(transformer, model_config)
        spatial = 2 ** (len(vae.config.dim_mult) - 1)
        h, w = cfg.height // spatial, cfg.width // spatial
        page_size = model.tokens_per_frame(h, w)
        super().__init__(cfg, pages_per_chunk=cfg.latent_frames,
                         pool_shape=(model.num_layers, model.num_heads, page_size,
                                     model.head_dim),
                         dtype=cfg.dtype, device=torch.device(cfg.device))
        self.config: MatrixGameBackendConfig = cfg
        self.name = f"matrix-game-2:{self.variant.name}"
        self.model, self.model_config = model, model_config
        self.vae, self.vae_dtype = vae, next(vae.parameters()).dtype
        self.image_encoder = image_encoder
        self.width, self.height, self.default_fps = cfg.width, cfg.height, cfg.fps
        temporal = 2 ** list(vae.config.temperal_downsample).count(True)
        self.chunk_frames = cfg.latent_frames * temporal
        self.supported_chunk_frames = (self.chunk_frames,)
        self.latent_shape = (vae.config.z_dim, cfg.latent_frames, h, w)
        act = model_config.action
        self.action_pools = ActionPools(len(act.blocks), self.k_pool.shape[1], page_size,
                                        act.heads_num, act.keyboard_hidden_dim // act.heads_num,
                                        act.enable_mouse, cfg.dtype, self.device)
        s = cfg.mouse_sensitivity  # screen y grows downwards; the model's pitch up is positive
        self.action_space = ActionSpace(self.variant.keys, mouse=self.variant.pointer,
                                        mouse_scale=(s, -s), mouse_limit=cfg.mouse_limit)
        self.wire_keys = self.variant.keys
        self.sigmas = mg.warped_sigmas(self.variant.timesteps, cfg.shift)
        self._images: OrderedDict[str, tuple[torch.Tensor, torch.Tensor]] = OrderedDict()
        self._image_lock = threading.Lock()
        self._default_image = self._read_start_image(cfg.start_image)

    # -- keys --------------------------------------------------------------------------------
    @property
    def controls(self) -> dict[str, Any]:
        """The page's controls: ``keys`` (browser code -> wire key), ``actions`` (wire key ->
        what it does), the model and variant."""
        return {"keys": dict(self.variant.codes), "actions": dict(self.variant.meanings),
                "model": "matrix-game-2", "variant": self.variant.name}

    def key_action(self, keys: frozenset[str]) -> int:
        """The held keys as a bitmask over the variant's keys (the id save points and
        action scripts carry); ValueError naming a key the variant lacks."""
        if isinstance(keys, str) or not hasattr(keys, "__iter__"):
            raise ValueError(f"keys must be a set of {list(self.variant.keys)}, got {keys!r}")
        hot = self.action_space.multi_hot(frozenset(keys))  # ValueError for an unknown key
        return sum(1 << i for i, v in enumerate(hot) if v)

    def step_cost(self, steps: int) -> int:
        """Forwards before the frames: steps past the distilled list are not run."""
        return min(steps, len(self.sigmas))

    # -- the start picture -------------------------------------------------------------------
    def _read_start_image(self, path: str | None) -> np.ndarray:
        if path is None:
            return mg.default_start_image(self.height, self.width)
        from worldstream.engine.studio.picture import fit_picture

        return fit_picture(Path(path).read_bytes(), self.width, self.height)

    def _encode_image(self, frame: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """``(context (257, dim), cond (20, cond_frames, h, w))`` of a start picture (kept
        for the last 8 pictures)."""
        if frame.shape != (self.height, self.width, 3) or frame.dtype != np.uint8:
            raise ValueError(f"a start picture is ({self.height}, {self.width}, 3) uint8, got "
                             f"{frame.shape} {frame.dtype}")
        key = hashlib.sha256(frame.tobytes()).hexdigest()
        with self._image_lock:
            if key in self._images:
                self._images.move_to_end(key)
                return self._images[key]
            tokens = self.image_encoder.encode(frame)
            context = self.model.project_image(tokens)[0].to(self.config.dtype)
            cond = mg.image_condition(self.vae, frame, self.config.cond_frames, self.vae_dtype,
                                      self.device)
            self._images[key] = (context, cond)
            if len(self._images) > 8:
                self._images.popitem(last=False)
            return context, cond

    # -- state lifecycle ---------------------------------------------------------------------
    def new_state(self, prompt: str, seed: int,
                  start_frames: np.ndarray | None = None) -> MatrixGameState:
        """A world from ``start_frames[0]`` (the picture start: ``(T, H, W, 3)`` uint8) or the
        start image, whose noise follows ``seed``. ``prompt`` is checked and kept (the model
        has none). ValueError for a bad prompt or picture."""
        check_prompt(prompt)
        frame = self._default_image if start_frames is None else np.asarray(start_frames)[0]
        context, cond = self._encode_image(frame)
        with self.settled():
            cfg = self.config
            table = PageTable(self.allocator, pages_per_chunk=self.pages_per_chunk,
                              window_chunks=cfg.window_chunks, sink=cfg.sink,
                              max_chunks=cfg.memory_chunks)
            return MatrixGameState(table, prompt, context, torch.Generator().manual_seed(seed),
                                   cond=cond, decode=new_decode_cache(self.vae))

    def prepare_prompt(self, text: str, blend_text: str | None = None,
                       blend_weight: float = 0.0) -> None:
        """Nothing to encode (no text model); the prompt is checked."""
        check_prompt(text)

    def set_prompt(self, state, text: str, blend_text: str | None = None,
                   blend_weight: float = 0.0) -> None:
        """Refused: Matrix-Game 2.0 has no text prompt (ValueError)."""
        raise ValueError("Matrix-Game 2.0 has no text prompt: start from a picture instead")

    def _embed(self, text: str, blend_text: str | None, weight: float) -> torch.Tensor:
        raise ValueError("Matrix-Game 2.0 has no text prompt")

    def _make_state(self, table, prompt, text, rng, **kwargs) -> MatrixGameState:
        # the runner's prompt start never reaches here: new_state (a picture start) is
        # overridden, so a call is a programming error, said plainly
        raise RuntimeError("Matrix-Game states are made by new_state from a picture")

    def _fork_state(self, state: MatrixGameState, table, rng) -> MatrixGameState:
        return MatrixGameState(table, state.prompt, state.text, rng, deque(state.history),
                               state.needs_recache, attention=state.attention, cond=state.cond,
                               decode=state.decode.snapshot())

    def free(self, state: MatrixGameState) -> None:
        """Release the state's pages (its action entries with them) and its decoder cache.
        Idempotent."""
        super().free(state)
        state.decode = WanDecodeCache()

    def _after_rewind(self, state: MatrixGameState) -> None:
        redecode(self, state)  # the action windows' history is the last record's

    # -- a chunk -----------------------------------------------------------------------------
    def attended(self, state: MatrixGameState, record: Any) -> list[int]:
        """The local window: the last ``local_attn_size - latent_frames`` frames before the
        chunk (a page is a frame)."""
        keep = self.model_config.local_attn_size - self.config.latent_frames
        pages = state.table.attended_pages()
        return pages[len(pages) - keep:] if keep > 0 else []

    def attention_context(self, pages, contexts, candidates=None,
                          attention=None) -> MatrixGameAttention:
        return MatrixGameAttention(
            super().attention_context(pages, contexts, candidates, attention), self.action_pools)

    def noise(self, generator: torch.Generator) -> torch.Tensor:
        return torch.randn(self.latent_shape, generator=generator)

    def conditioning(self, states: list[MatrixGameState], records: list) -> tuple:
        f = self.config.latent_frames
        cond = torch.stack([mg.condition_frames(s.cond, r.position, f)
                            for s, r in zip(states, records)])
        mouse = None if records[0].mouse is None else \
            torch.stack([r.mouse for r in records]).to(self.device)
        return (cond.to(self.device), torch.stack([s.text for s in states]),
                torch.tensor([r.position for r in records]), mouse,
                torch.stack([r.keyboard for r in records]).to(self.device))

    def forward(self, x, sigma: float, cond: tuple, ctx: PagedAttentionContext
                 ) -> torch.Tensor:
        """Flow prediction of chunks ``x`` ``(B, 16, F, h, w)`` at noise ``sigma`` (every
        frame), conditioned by :meth:`conditioning`."""
        image, context, starts, mouse, keyboard = cond
        t = torch.full((x.shape[0], x.shape[2]), sigma * NUM_TRAIN_TIMESTEPS,
                       device=self.device)
        return self.model.forward_chunk(x, image, t, context, starts, mouse, keyboard,
                                        ctx).float()

    def to_x0(self, x: torch.Tensor, sigma: float, out: torch.Tensor) -> torch.Tensor:
        return x - sigma * out  # the model predicts the flow noise - x0


def estimate_pool_bytes(model_config: MatrixGameConfig, cfg: MatrixGameBackendConfig
                        ) -> dict[str, int]:
    """Bytes of the KV pool and the action pools the backend allocates (the page budget of
    ``max_states`` states), for the memory check before loading."""
    elem = torch.empty((), dtype=cfg.dtype).element_size()
    pages = cfg.pages_per_state(cfg.latent_frames) * cfg.max_states
    tokens = (cfg.height // 16) * (cfg.width // 16)  # 8x VAE, 2x2 patches
    kv = 2 * model_config.num_layers * pages * tokens * model_config.dim * elem
    act = model_config.action
    per_token = (tokens if act.enable_mouse else 0) + 1  # mouse: every token; keyboard: one
    action = 2 * len(act.blocks) * pages * per_token * act.keyboard_hidden_dim * elem
    return {"kv_pool": kv, "action_pools": action}


def load_matrix_game_backend(model_path: str | Path | None = None, variant: str = "universal",
                             **kwargs) -> MatrixGameBackend:
    """Matrix-Game 2.0 from a folder of the published layout
    (:mod:`engine.models.matrix_game.loading`); ``kwargs`` go to
    :class:`MatrixGameBackendConfig`. Raises FileNotFoundError naming the first missing file,
    ValueError (variant, dtype, config), KeyConversionError (checkpoint keys that do not match,
    listed), InsufficientMemoryError (estimated before loading)."""
    from worldstream.engine.models.matrix_game import loading
    from worldstream.engine.models.wan.loading import check_dtype, check_memory

    if model_path is None:
        raise ValueError("model matrix-game-2 needs --model-path DIR: the Skywork/"
                         "Matrix-Game-2.0 release (base_distilled_model/, Wan2.1_VAE.pth, ...)")
    cfg = MatrixGameBackendConfig(variant=variant, **kwargs)
    chosen = get_variant(cfg.variant)
    layout = loading.check_layout(model_path, chosen)  # FileNotFoundError
    device = torch.device(cfg.device)
    check_dtype(cfg.dtype, device)
    model_config = chosen.config()
    size = torch.empty((), dtype=cfg.dtype).element_size()
    parts = {name: file.stat().st_size // 4 * size  # fp32 files; a bf16 file overcounts
             for name, file in (("transformer", layout.checkpoint), ("vae", layout.vae),
                                ("clip", layout.clip))}
    check_memory({**parts, **estimate_pool_bytes(model_config, cfg)}, device)
    transformer = loading.load_transformer(layout.checkpoint, model_config, cfg.dtype, device)
    vae = loading.load_vae(layout.vae, cfg.dtype, device)
    encoder = loading.load_image_encoder(layout.clip, cfg.dtype, device)
    return MatrixGameBackend(transformer, model_config, vae, encoder, cfg)
