"""The stages of a Matrix-Game 2.0 chunk that differ from the shared ones
(:mod:`engine.backends.stages`), and the start picture's conditioning.

``plan``: each chunk's record with its latent frames' action windows (from the job's
per-frame controls, the raw-action history of the state's last chunk, left padding on a
stream's first chunk). ``noise`` and ``denoise``: the distilled sampler of the published
model: at each of the variant's timesteps the model predicts x0, which is noised again to the
next level with fresh noise from the chunk's generator (not an ODE step).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch

from worldstream.engine.backends.stages import ChunkBatch, keep_latents
from worldstream.engine.models.matrix_game.conditions import (
    action_windows,
    chunk_raw_frames,
    raw_inputs,
)

if TYPE_CHECKING:
    from worldstream.engine.backends.paged_context import PagedAttentionContext
    from worldstream.engine.core.action_space import ActionSpace


class MatrixGameRunner(Protocol):
    """What these stages use of their backend (``MatrixGameBackend``), as a ``Protocol``: the
    stages never import the backend that lists them. ``latent_shape``: ``(channels, frames,
    height, width)`` of one chunk's latents; ``sigmas``: the variant's warped noise levels;
    ``variant``: its ``Variant`` (keys, timesteps); ``model_config``: the DiT's config."""

    name: str
    device: torch.device
    config: Any
    model_config: Any
    variant: Any
    action_space: ActionSpace
    latent_shape: tuple[int, int, int, int]
    sigmas: Any

    def forward(self, x: torch.Tensor, sigma: float, cond: tuple,
                ctx: PagedAttentionContext) -> torch.Tensor: ...

    def to_x0(self, x: torch.Tensor, sigma: float, out: torch.Tensor) -> torch.Tensor: ...


def warped_sigmas(timesteps: tuple[int, ...], shift: float,
                  train_steps: int = 1000) -> list[float]:
    """The noise levels of a distilled step list (``denoising_step_list`` with
    ``warp_denoising_step``): step ``t`` is the level ``t / 1000`` of the 1000-step schedule,
    shifted as ``shift s / (1 + (shift - 1) s)``; (1000, 666, 333) at shift 5 -> 1, 0.9088,
    0.7140."""
    out = []
    for t in timesteps:
        base = 1.0 - (train_steps - t) / train_steps
        out.append(shift * base / (1 + (shift - 1) * base))
    return out


@dataclass
class MatrixGameChunk:
    """One chunk of a stream: its clean latents ``(16, F, h, w)`` (None until denoised), its
    first latent frame's index, the action windows its frames read (``keyboard`` ``(F, 12,
    K)``, ``mouse`` ``(F, 24)`` or None) and the raw-action history after it (``tails``: the
    last 12 raw keyboard and mouse frames) that the next chunk continues from."""

    latents: torch.Tensor | None
    position: int
    keyboard: torch.Tensor
    mouse: torch.Tensor | None
    tails: tuple[torch.Tensor, torch.Tensor | None]
    rng: Any = None  # the generator of this chunk's noise (not kept after the chunk)
    context: torch.Tensor | None = None  # what the cache fill consumed
    extra: dict = field(default_factory=dict)

    @property
    def num_frames(self) -> int:
        return self.latents.shape[1]


def job_controls(backend: MatrixGameRunner, job) -> torch.Tensor:
    """The job's per-frame action vectors ``(T, size)``: its ``controls``, or (a job of an
    action script) its action ids decoded (held keys, no mouse motion)."""
    space = backend.action_space
    if job.controls is not None:
        return torch.tensor(job.controls, dtype=torch.float32).view(len(job.controls), -1)
    rows = []
    for action in job.actions:
        keys = frozenset(k for i, k in enumerate(space.keys) if action >> i & 1)
        rows.append(space.frame_controls(keys, (0.0, 0.0), 1)[0])
    return torch.tensor(rows, dtype=torch.float32)


def plan(backend: MatrixGameRunner, batch: ChunkBatch) -> None:
    """Stage: each chunk's record (position, action windows, history after it, noise
    generator)."""
    cfg, variant = backend.model_config.action, backend.variant
    f = backend.config.latent_frames
    records = []
    for job, state in zip(batch.jobs, batch.states):
        controls = job_controls(backend, job)
        if controls.shape[1] != backend.action_space.size:
            raise ValueError(f"controls of {controls.shape[1]} values per frame; "
                             f"{backend.name} takes {backend.action_space.size}")
        first = not state.history
        raw = chunk_raw_frames(controls, f, first, cfg.vae_time_compression_ratio)
        keyboard, mouse = raw_inputs(variant, raw)
        prev = state.history[-1].tails if state.history else (None, None)
        kb, kb_tail = action_windows(None if first else prev[0][None], keyboard[None], f,
                                     cfg.window, cfg.vae_time_compression_ratio)
        mw = mouse_tail = None
        if cfg.enable_mouse:
            mw, mouse_tail = action_windows(None if first else prev[1][None], mouse[None], f,
                                            cfg.window, cfg.vae_time_compression_ratio)
            mw = mw[0].flatten(1)  # (F, 12 * 2): frame by frame (pitch, yaw)
            mouse_tail = mouse_tail[0]
        rng = state.rng if job.seed is None else torch.Generator().manual_seed(job.seed)
        records.append(MatrixGameChunk(None, state.position, kb[0], mw,
                                       (kb_tail[0], mouse_tail), rng))
    batch.records = records


def noise(backend: MatrixGameRunner, batch: ChunkBatch) -> None:
    """Stage: each chunk's initial noise from its record's generator."""
    batch.noise = torch.stack([torch.randn(backend.latent_shape, generator=r.rng)
                               for r in batch.records]).to(backend.device)


def denoise(backend: MatrixGameRunner, batch: ChunkBatch) -> None:
    """Stage: the variant's distilled steps (the first ``steps`` of them): predict x0 at each
    level, noise it afresh to the next; the last prediction is the chunk."""
    sigmas = backend.sigmas[:max(1, min(batch.steps, len(backend.sigmas)))]
    x, x0 = batch.noise, batch.noise
    for i, sigma in enumerate(sigmas):
        out = backend.forward(x, sigma, batch.cond, batch.attention)
        x0 = backend.to_x0(x, sigma, out)
        if i + 1 < len(sigmas):
            nxt = sigmas[i + 1]
            eps = torch.stack([torch.randn(backend.latent_shape, generator=r.rng)
                               for r in batch.records]).to(x0.device)
            x = (1.0 - nxt) * x0 + nxt * eps
    batch.x0 = x0
    keep_latents(backend, batch)
    for rec in batch.records:
        rec.rng = None  # a record outlives its chunk: keep no generator alive


# -- the start picture -------------------------------------------------------------------
def default_start_image(height: int, width: int) -> np.ndarray:
    """A plain start picture when none is given: a sky over a horizon and green ground,
    ``(height, width, 3)`` uint8."""
    y = np.linspace(0.0, 1.0, height)[:, None, None]
    sky = np.array([110, 160, 225]) * (1 - y) + np.array([200, 220, 240]) * y
    ground = np.array([70, 120, 60]) * (1.6 - y)
    image = np.where(y < 0.55, sky, ground)
    return np.broadcast_to(image, (height, width, 3)).clip(0, 255).astype(np.uint8).copy()


@torch.no_grad()
def image_condition(vae, frame: np.ndarray, frames: int, dtype: torch.dtype,
                    device: torch.device) -> torch.Tensor:
    """The picture's condition channels ``(20, frames, h, w)`` float32: 4 mask channels (ones
    on latent frame 0) and the normalised VAE latents of the picture followed by
    ``4 (frames - 1)`` zero (mid-grey) frames, as the published model was trained (its
    cond of later frames is the encoder's answer to those grey frames, not zeros)."""
    x = torch.from_numpy(np.ascontiguousarray(frame)).permute(2, 0, 1).float() / 127.5 - 1.0
    video = torch.zeros(1, 3, 1 + 4 * (frames - 1), *x.shape[1:])
    video[0, :, 0] = x
    latents = vae.encode(video.to(device, dtype)).latent_dist.mode().float()
    shape = (1, vae.config.z_dim, 1, 1, 1)
    mean = torch.tensor(vae.config.latents_mean, device=latents.device).view(shape)
    std = torch.tensor(vae.config.latents_std, device=latents.device).view(shape)
    latents = ((latents - mean) / std)[0]
    mask = torch.zeros(4, *latents.shape[1:], device=latents.device)
    mask[:, 0] = 1.0
    return torch.cat([mask, latents], 0)


def condition_frames(cond: torch.Tensor, position: int, frames: int) -> torch.Tensor:
    """``frames`` latent frames of a picture's condition from ``position`` on; past the
    frames encoded, the last one (the encoder's response to grey frames settles once its
    causal receptive field holds no picture)."""
    index = torch.arange(position, position + frames).clamp(max=cond.shape[1] - 1)
    return cond[:, index.to(cond.device)]
