"""The neural world backend: a trained :class:`WorldDiT` and its autoencoder over the paged
temporal KV cache and the spatial memory.

One :class:`BuiltinBackend` holds the model, the autoencoder and one preallocated KV pool
``[num_layers, num_pages, heads, page_size, head_dim]`` shared by every session and branch
(one page = the 64 tokens of one latent frame). A chunk walks :data:`STAGES` (see
``engine.backends.stages``)::

    plan -> select_pages -> condition -> noise -> denoise -> show   | frames delivered
    cache_fill -> commit -> remember                                | after delivery

A stream starts from real simulator frames of the prompt's scene (encoded, cache-filled and
written to memory as the first chunk). A prompt switch recaches the window under the new text
embedding and starts new memory epochs (remembered ground is restyled on sight).
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import replace

import numpy as np
import torch
from diffusers.utils import logging as diffusers_logging

from worldstream.engine.backends import cache_fill
from worldstream.engine.backends import stages as shared
from worldstream.engine.backends.builtin import compositing, guidance, memory, pages, plan
from worldstream.engine.backends.builtin import noise as noise_stage
from worldstream.engine.backends.builtin.bases import BaseCache
from worldstream.engine.backends.builtin.config import BuiltinConfig
from worldstream.engine.backends.builtin.savestate import BuiltinSaves
from worldstream.engine.backends.builtin.state import BuiltinState, ChunkRecord
from worldstream.engine.backends.paged_context import PagedAttentionContext
from worldstream.engine.backends.runner import PagedRunner
from worldstream.engine.backends.stages import Stage
from worldstream.engine.core.backend import BackendInfo, ChunkJob, dtype_name
from worldstream.engine.models.builtin import attention
from worldstream.engine.models.builtin import text as text_encoder
from worldstream.engine.models.builtin.autoencoder import frames_to_tensor, tensor_to_frames
from worldstream.engine.models.builtin.spatial_memory import SpatialMemory, centre_box
from worldstream.engine.models.builtin.world_dit import WorldDiT
from worldstream.engine.models.device import cpu_has_fast_bf16
from worldstream.engine.worlds.actions import IDLE, keys_to_action
from worldstream.engine.worlds.catalog import make_base_warp

log = logging.getLogger(__name__)

#: one chunk's path up to its frames (the stage's time is reported as ``reported_as``)
STAGES = (
    Stage("plan", plan.plan, "memory_read"),
    Stage("select_pages", pages.select_pages, "memory_read"),
    Stage("condition", shared.condition, "memory_read"),
    Stage("noise", noise_stage.noise, "memory_read"),
    Stage("denoise", guidance.denoise, "denoise"),
    Stage("show", compositing.show, "decode"),
)
#: one chunk's path after its frames were delivered
AFTER_DELIVERY = (
    Stage("cache_fill", shared.cache_fill),
    Stage("commit", shared.commit),
    Stage("remember", memory.remember),
)


def _to(module: torch.nn.Module, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    module = module.to(device).eval()
    # diffusers warns on any dtype cast, even a no-op one: cast only when it changes something
    if dtype == torch.float32:
        return module
    verbosity = diffusers_logging.get_verbosity()
    diffusers_logging.set_verbosity_error()
    try:
        return module.to(dtype=dtype)
    finally:
        diffusers_logging.set_verbosity(verbosity)


class BuiltinBackend(PagedRunner, BuiltinSaves):
    """``engine.core.backend.WorldBackend`` for a trained :class:`WorldDiT` + autoencoder:
    the shared :class:`~engine.backends.runner.PagedRunner` walking :data:`STAGES`."""

    name = "builtin"
    default_fps = 15
    #: ``new_state`` takes ``start_frames`` (a start from a picture, engine.studio.worldio)
    starts_from_frames = True
    negative_forwards = 2  # prompt and action guidance

    def info(self) -> BackendInfo:
        """A landscape (or the avatar it carries) steered by the direction keys, one chunk
        size, started from a picture too."""
        return self.runner_info(world="landscape", supported_chunk_frames=(self.chunk_frames,),
                                starts_from_frames=self.starts_from_frames,
                                autoencoder_dtype=dtype_name(self.ae_dtype),
                                compile=self.config.compile)

    def __init__(self, model: WorldDiT, autoencoder, config: BuiltinConfig | None = None):
        cfg = config or BuiltinConfig()
        device = torch.device(cfg.device)
        if device.type == "cpu" and cfg.cpu_threads:
            torch.set_num_threads(cfg.cpu_threads)
        mc = model.config
        super().__init__(
            cfg,
            pages_per_chunk=mc.chunk_frames,
            pool_shape=(mc.depth, mc.num_heads, model.tokens_per_frame, mc.dim // mc.num_heads),
            dtype=cfg.dtype,
            device=device,
            topk_pages=cfg.topk_pages,
        )
        if cfg.kept_factors and (mc.action_factors is None or not all(
                0 <= i < len(mc.action_factors) for i in cfg.kept_factors)):
            raise ValueError(f"kept_factors {cfg.kept_factors} name no factors of this model's "
                             f"actions (action_factors {mc.action_factors})")
        self.config: BuiltinConfig = cfg
        self.stages, self.after_delivery = STAGES, AFTER_DELIVERY
        self.model = _to(model, device, cfg.dtype)
        self.ae_dtype = cfg.autoencoder_dtype or (
            torch.bfloat16
            if device.type == "cuda" or (device.type == "cpu" and cpu_has_fast_bf16())
            else cfg.dtype
        )
        # NOTE: channels-last (NHWC) weights let oneDNN run the convolutions without reordering
        # every activation, with bit-identical output (`python -m bench baselines`)
        self.ae = _to(autoencoder, device, self.ae_dtype).to(memory_format=torch.channels_last)
        self.chunk_frames = mc.chunk_frames
        self.width = self.height = mc.image_size
        self.downsample = mc.image_size // mc.latent_size
        self.exclude = centre_box(mc.image_size, mc.view_box)
        # the rig whose pose path conditions each frame (the model's ``pose_path``), None
        self.pose_rig = make_base_warp(mc.pose_path, mc.image_size) if mc.pose_path else None
        self.base_cache = BaseCache()
        self._net: torch.nn.Module = self.model  # what forward calls (or its compiled form)
        if cfg.compile:
            self._compile()

    def _compile(self) -> None:
        """Compile the model and run warm-up chunks of one and of two streams (a batch of one
        gets a graph of its own: dynamo specialises sizes of 1), so that no stream waits for
        the compiler; on failure log it and stay eager."""
        self._net = torch.compile(self.model, dynamic=True)
        cfg = self.config
        # NOTE: the two streams run as one batch even where jobs run one by one: the graph
        # for forwards of several rows (a guided step's stacked negative rows) must be
        # compiled here, not at a stream's first expression or prompt switch
        invariant, cfg.batch_invariant = cfg.batch_invariant, False
        try:
            states = [self.new_state("warm-up", i) for i in range(min(2, self.max_states))]
            try:
                for n in range(1, len(states) + 1):
                    self.generate([ChunkJob(s, [IDLE] * self.chunk_frames, 1)
                                   for s in states[:n]])
                    self.finish()
            finally:
                for s in states:
                    self.free(s)
        except Exception as exc:  # inductor needs a C++ compiler; a failure must not stop play
            log.warning("torch.compile failed, running the model eagerly: %s", exc)
            self._net = self.model
        finally:
            cfg.batch_invariant = invariant

    # -- keys and prompts -----------------------------------------------------------------
    def key_action(self, keys: frozenset[str]) -> int:
        """The landscape's action id (``engine.worlds.actions``) for held direction keys;
        ValueError naming an unknown key."""
        return keys_to_action(keys)

    def _embed(self, text: str, blend_text: str | None, weight: float) -> torch.Tensor:
        return torch.as_tensor(np.array(text_encoder.embed_blend(text, blend_text, weight)))

    def _on_prompt(self, state: BuiltinState, blend_text: str | None, blend_weight: float
                   ) -> None:
        state.restyle_left = self.config.restyle_chunks
        state.guide_left = self.config.guidance_chunks or 0
        if self.config.refining_detail_cap is not None or self.config.colour_anchor is not None:
            # the real frames seen were of the old prompt: the references become those of the
            # frames a stream of the new prompt (its heavier part) would start from at this
            # world seed
            state.reference_prompt = (blend_text if blend_text is not None
                                      and blend_weight > 0.5 else state.prompt)
            memory.set_references(self, state, memory.simulated_start(
                self, state.reference_prompt, state.noise_seed))

    # -- state lifecycle ------------------------------------------------------------------
    def new_state(
        self, prompt: str, seed: int, start_frames: np.ndarray | None = None
    ) -> BuiltinState:
        """A stream that starts from ``start_frames`` (``(chunk_frames, H, W, 3)`` uint8), by
        default simulator frames of the prompt's nearest scene at world ``seed``. ValueError
        for a bad prompt or start frames."""
        shape = (self.chunk_frames, self.height, self.width, 3)
        if start_frames is not None and start_frames.shape != shape:
            raise ValueError(f"start_frames must be {shape} uint8, got {start_frames.shape}")
        if start_frames is None:
            start_frames = memory.simulated_start(self, prompt, seed)
        return super().new_state(prompt, seed, start_frames=start_frames)

    def new_memory(self) -> SpatialMemory:
        """A stream's empty spatial memory, as this model keeps it (a save point's must
        match: ``savestate.check_builtin``)."""
        return SpatialMemory(max_tiles=self.config.memory_tiles,
                             settle_px=self.config.memory_settle_px)

    def _make_state(self, table, prompt, text, rng, start_frames=None) -> BuiltinState:
        return BuiltinState(table, prompt, text, rng, memory=self.new_memory(),
                            start_frames=start_frames, noise_seed=rng.initial_seed(),
                            reference_prompt=prompt)

    def _fork_state(self, state: BuiltinState, table, rng) -> BuiltinState:
        return BuiltinState(
            table, state.prompt, state.text, rng,
            deque(replace(r, undo=list(r.undo)) for r in state.history),
            state.needs_recache, memory=state.memory.fork(), start_frames=state.start_frames,
            restyle_left=state.restyle_left, guide_left=state.guide_left,
            noise_seed=state.noise_seed, detail_reference=state.detail_reference,
            colour_reference=state.colour_reference, reference_prompt=state.reference_prompt,
        )

    def _undo_extra(self, state: BuiltinState, record: ChunkRecord) -> None:
        memory.undo(state, record)

    @torch.no_grad()
    def observe(self, state: BuiltinState, frames: np.ndarray, actions: list[int]) -> None:
        """Append real frames (``(chunk_frames, H, W, 3)`` uint8, with the actions that
        produced them) to the state's context and memory instead of generating them: teacher
        forcing, and restoring a session from its recent frames. The camera follows the
        actions through the model's camera dynamics."""
        with self.settled():
            self._prefill(state)
            if state.needs_recache:
                cache_fill.recache(self, state)
            self._append_frames(state, frames, list(actions), move=True)

    def _prefill(self, state: BuiltinState) -> None:
        if state.start_frames is not None:
            frames, state.start_frames = state.start_frames, None
            # the start frames are given, not stepped: the camera stays at the origin
            self._append_frames(state, frames, [IDLE] * len(frames), move=False)

    def _append_frames(self, state: BuiltinState, frames: np.ndarray, actions: list[int],
                       move: bool) -> None:
        rec = plan.plan_chunks(self, [state], [actions], move=move)[0][0]
        rec.latents = self.encode_frames(frames)
        memory.set_references(self, state, frames, rec.latents)
        # the colour anchor's running mean starts at the new reference
        rec.colour_mean = rec.colour_reference = state.colour_reference
        cache_fill.append(self, state, [rec])
        memory.write(self, state, rec, frames, settled=True)
        self.trim_history(state)

    # -- the model's services to the stages ----------------------------------------------
    def _validate_job(self, job: ChunkJob) -> None:
        if any(not 0 <= a < self.model.config.num_actions for a in job.actions):
            raise ValueError(f"action ids must be in [0, {self.model.config.num_actions})")

    def noise(self, generator: torch.Generator) -> torch.Tensor:
        """Fresh white noise ``(F, C, h, w)`` float32 from ``generator``."""
        mc = self.model.config
        return torch.randn((self.chunk_frames, mc.latent_channels, mc.latent_size,
                            mc.latent_size), generator=generator)

    def _first_step_skipped(self, steps: int) -> bool:
        return guidance.first_step_skipped(self.config, steps)

    def conditioning(self, states: list[BuiltinState], records: list[ChunkRecord]) -> tuple:
        """Conditioning tensors of a batch of chunks (one record per state): memory bases,
        their noise level, current/stale planes, actions, text, frame positions, which rows
        are guided ``(B,)`` bool, the second skip source (None for a model without
        ``skip_source``) and the rig's poses ``(B, F, 2)`` (None without ``pose_path``)."""
        f = self.chunk_frames
        dev, dt = self.device, self.config.dtype
        base = torch.stack([r.base for r in records]).to(dev, dt)
        known = torch.stack([r.known for r in records]).to(dev, dt)
        base_sigma = torch.full((len(records), f), self.config.ctx_sigma, device=dev)
        actions = torch.tensor([r.actions for r in records], device=dev)
        txt = torch.stack([s.text for s in states]).to(dev)[:, None].expand(-1, f, -1)
        pos = torch.tensor([[r.position + i for i in range(f)] for r in records], device=dev)
        guided = torch.tensor([r.guided for r in records], device=dev)
        skip = (torch.stack([r.skip for r in records]).to(dev, dt)
                if self.model.config.skip_source else None)
        pose = (torch.as_tensor(np.stack([r.poses for r in records]), dtype=torch.float32,
                                device=dev)
                if self.pose_rig is not None else None)
        return base, base_sigma, known, actions, txt, pos, guided, skip, pose

    def forward(self, x, sigma: float, cond: tuple, ctx: PagedAttentionContext) -> torch.Tensor:
        base, base_sigma, known, actions, txt, pos, _, skip, pose = cond
        sig = torch.full(actions.shape, sigma, device=self.device)
        # NOTE: fresh contiguous inputs: a compiled graph guards on its inputs' strides and on
        # whether each is a view of a larger tensor, and the stacked rows of a guided step or
        # a batch of streams come in other layouts than the warm-up's: each would compile a
        # graph of its own mid-stream
        x, base, base_sigma, known, actions, txt, pos, skip, pose = (
            None if t is None else t.clone(memory_format=torch.contiguous_format)
            for t in (x.to(self.config.dtype), base, base_sigma, known, actions, txt, pos,
                      skip, pose))
        with attention.bound(ctx):  # what a compiled model attends through
            return self._net(x, base, base_sigma, known, sig, actions, txt, pos, ctx,
                             skip=skip, pose=pose)

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
