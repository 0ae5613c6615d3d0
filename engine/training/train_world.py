"""Train the built-in world model (``worldstream train-world``).

Flow matching on normalised autoencoder latents, x_σ = (1 - σ)·x0 + σ·ε, the network predicting
x0 on top of each frame's spatial-memory base (``engine.models.builtin.spatial_memory``; the bases
are replayed from the recorded episodes exactly as the engine reads them, see
``engine.training.latents.memory_bases``). Clips of ``frames`` frames in chunks of
``chunk_frames``; block-causal attention; an independent noise level per chunk (Diffusion
Forcing), drawn logit-normal (SD3). Most rows are inference-like: the chunks before a random
chunk k are noise-augmented context at a small level σ ~ U[0, ctx_sigma_max] (GameNGen/DIAMOND
context noise; the level is conditioning), and every base is noised the same way, so the model
learns to continue from the cache-filled context and the decoded memory it sees when streaming.
Text embeddings are dropped 10% of the time. AdamW with warmup, EMA of the weights (diffusers
``EMAModel``); checkpoints every ``ckpt_every`` steps for resume; EMA weights exported to
``out_dir`` with ``save_pretrained``. The camera dynamics are fitted first, on the recorded
camera paths (:func:`fit_camera_dynamics`).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from diffusers.optimization import get_constant_schedule_with_warmup
from diffusers.training_utils import EMAModel
from tqdm import tqdm

from worldstream.engine.models.builtin.attention import (
    DenseContext,
    block_causal_frame_mask,
    expand_frame_mask,
)
from worldstream.engine.models.builtin.world_dit import CameraDynamics, WorldDiT, warm_start
from worldstream.engine.models.builtin.world_noise import training_noise
from worldstream.engine.training.common import (
    autocast,
    load_checkpoint,
    pick_device,
    save_checkpoint,
    seed_everything,
)
from worldstream.engine.training.latents import VIEW_BOX, LatentDataset, attach_poses
from worldstream.engine.worlds.catalog import make_base_warp


def sample_chunk_sigmas(
    gen: torch.Generator, batch: int, num_chunks: int, ctx_sigma_max: float,
    p_context: float = 0.5,
) -> torch.Tensor:
    """``(B, num_chunks)`` noise levels: logit-normal per chunk; in a fraction ``p_context``
    of the rows the chunks before a random chunk k >= 1 are context at U[0, ctx_sigma_max].

    NOTE: motion is only learnable where the context is clean enough to read the camera's
    velocity from; with half the rows pure Diffusion Forcing the model settled on copying the
    last frame, so the recipe uses p_context = 0.9."""
    sig = torch.sigmoid(torch.randn(batch, num_chunks, generator=gen))
    inference_like = torch.rand(batch, generator=gen) < p_context
    k = torch.randint(1, max(num_chunks, 2), (batch,), generator=gen)
    before_k = torch.arange(num_chunks)[None] < k[:, None]
    ctx = torch.rand(batch, num_chunks, generator=gen) * ctx_sigma_max
    return torch.where(inference_like[:, None] & before_k, ctx, sig)


def fit_camera_dynamics(
    camera_model: CameraDynamics, camera: torch.Tensor, actions: torch.Tensor, steps: int = 100
) -> float:
    """Fit :class:`CameraDynamics` to recorded camera paths: unrolled over whole episodes (they
    start at rest), matching each path relative to its frame 0, with L-BFGS (``torch.optim``;
    a few hundred parameters, a smooth loss: it converges where Adam crawled, and fitting
    whole paths keeps errors from compounding over a long drive).

    ``camera (E, L, 2)`` integer crop origins (px), ``actions (E, L)`` int64. The recorded
    origins are the floor of the true position, so targets carry up to 1 px of rounding noise,
    which averages out (one-step regression on differenced positions was biased by it).
    Returns the final RMS position error (px)."""
    e, n = actions.shape
    target = (camera - camera[:, :1]).float()
    opt = torch.optim.LBFGS(
        camera_model.parameters(), lr=1.0, max_iter=steps, line_search_fn="strong_wolfe"
    )

    def path_loss():
        v = camera_model(torch.zeros(e, 2), actions[:, 0])
        pos = torch.zeros(e, 2)
        path = [pos]
        for t in range(1, n):
            v = camera_model(v, actions[:, t])
            pos = pos + v
            path.append(pos)
        return torch.mean((torch.stack(path, dim=1) - target) ** 2)

    def closure():
        opt.zero_grad(set_to_none=True)
        loss = path_loss()
        loss.backward()
        return loss

    opt.step(closure)
    with torch.no_grad():
        return float(path_loss().sqrt())


def degrade_bases(zb: torch.Tensor, gen: torch.Generator, p: float) -> torch.Tensor:
    """In a fraction ``p`` of the frames, blur the base latents ``(B, F, C, h, w)`` (3 × 3 box)
    and shift each channel by N(0, 0.3²) (normalised units: a colour cast).

    NOTE: in training, memory holds the autoencoder's reconstructions of real frames; in a
    free rollout it holds the model's own output, blurrier and drifting in colour, and new
    ground is generated next to it. Trained on clean memory only, step-1,000 weights copied
    that drift into every new strip until a snowy world had turned green by frame 70: the
    model must learn that memory can be off and that the prompt says what the world looks
    like (exposure bias, as context noise handles it for the temporal context)."""
    b, f, c, h, w = zb.shape
    hit = (torch.rand(b, f, 1, 1, 1, generator=gen) < p).to(zb.device)
    blurred = F.avg_pool2d(zb.reshape(b * f, c, h, w), 3, 1, 1, count_include_pad=False)
    cast = 0.3 * torch.randn(b, f, c, 1, 1, generator=gen).to(zb.device)
    return torch.where(hit, blurred.reshape(zb.shape) + cast, zb)


def previous_frames(lat: torch.Tensor, chunk_frames: int) -> torch.Tensor:
    """``lat (B, F + c, ...)``, a clip with one chunk of ``c = chunk_frames`` frames before it,
    -> ``(B, F, ...)`` for each of the clip's last F frames the last frame before its chunk
    (a ``"previous"`` skip source: within a chunk generated at once, the frame just before is
    not known yet)."""
    last = lat[:, chunk_frames - 1 : -1 : chunk_frames]
    return last.repeat_interleave(chunk_frames, dim=1)


def recipe_clips(data: LatentDataset, rng: np.random.Generator, batch: int, frames: int,
                 chunk_frames: int, skip_source: str | None) -> tuple:
    """A batch of the recipe's clips: ``(lat, base, known, actions, txt, skip, pose)``, the
    first five as :meth:`LatentDataset.sample` gives them, ``skip (B, F, C, h, w)`` raw
    latents of each frame's second skip source (``skip_source``: ``"previous"``, the frame
    before its chunk, :func:`previous_frames`; ``"warped"``, ``data.skip``; None: None) and
    ``pose (B, F, 2)`` the rig's pose at each frame (None unless the data has poses:
    :func:`~engine.training.latents.attach_poses`). ValueError for a ``"warped"`` source the
    data lacks."""
    if skip_source == "warped" and data.skip is None:
        raise ValueError("the data has no warped memory pictures (data.skip)")
    c = chunk_frames if skip_source == "previous" else 0
    rows, idx = data.clip_index(rng, batch, frames + c)
    lat, base, known, actions, txt, _ = data.clips(rows, idx)
    skip = (previous_frames(lat, chunk_frames) if skip_source == "previous"
            else data.skip[rows, idx].float() if skip_source == "warped" else None)
    pose = data.pose[rows, idx[:, c:]] if data.pose is not None else None
    return lat[:, c:], base[:, c:], known[:, c:], actions[:, c:], txt[:, c:], skip, pose


def noised_skip(model: WorldDiT, skip: torch.Tensor | None, gen: torch.Generator,
                base_sig: torch.Tensor, p_degrade: float, device: torch.device):
    """The second skip source as trained: raw latents ``skip (B, F, C, h, w)`` normalised,
    degraded in a fraction ``p_degrade`` of the frames (:func:`degrade_bases`: a previous frame
    in a stream is the model's own, blurrier and off in colour) and noised at each frame's base
    level ``base_sig (B, F)`` (context noise; the engine feeds both at ``ctx_sigma``); None
    passes through."""
    if skip is None:
        return None
    zs = degrade_bases(model.normalize(skip.to(device)), gen, p_degrade)
    ss = base_sig[..., None, None, None]
    return (1 - ss) * zs + ss * torch.randn(zs.shape, generator=gen).to(device)


@dataclass
class WorldPrediction:
    """One training forward of :func:`world_prediction`, model space: ``pred``/``target``
    ``(B, F, C, h, w)`` the predicted and the true clean latents, ``weight`` ``(B, F, 1, h, w)``
    the squared error's weight, ``sigma (B, F)`` each frame's noise level, ``known (B, F, 2, h,
    w)``, ``txt (B, F, 384)`` the text as fed (dropped rows zero)."""

    pred: torch.Tensor
    target: torch.Tensor
    weight: torch.Tensor
    sigma: torch.Tensor
    known: torch.Tensor
    txt: torch.Tensor
    base: torch.Tensor | None = None  # (B, F, C, h, w) the clean memory bases, model space

    def loss(self, kind: str = "mse", ghost_weight: float = 0.0) -> torch.Tensor:
        """The weighted error (:func:`world_loss`): squared (``"mse"``), or absolute
        (``"l1"``: its optimum is the conditional median, not the mean, so where the model
        cannot tell two pictures apart it is not rewarded for drawing half of each); plus
        ``ghost_weight`` times :meth:`ghost_error`. ValueError for another ``kind`` or a
        negative ``ghost_weight``, or a ghost weight without ``base``."""
        if not isinstance(kind, str) or kind not in LOSSES:
            raise ValueError(f"loss must be one of {LOSSES}, got {kind!r}")
        if ghost_weight < 0 or (ghost_weight and self.base is None):
            raise ValueError(f"ghost_weight must be >= 0 and needs the bases, got {ghost_weight}")
        err = self.pred - self.target
        err = err.abs() if kind == "l1" else err ** 2
        total = torch.sum(self.weight.expand_as(self.pred))
        out = torch.sum(self.weight * err) / total
        if ghost_weight:
            out = out + ghost_weight * self.ghost_error() / total
        return out

    def ghost_error(self) -> torch.Tensor:
        """The weighted squared error along each frame's ghost direction, summed over frames:
        ``relu(<e, g>_w)² / <g, g>_w`` with ``e`` the prediction's error and ``g = base −
        target`` (where the frame differs from the picture in memory), the part of the error
        that is the memory picture blended in (at most the frame's whole squared error).

        Why: the avatar's turned heads carry a ghost of the head at rest (``head_turn_ghost_
        share`` 0.095 for v2.7), a blend the squared error does not punish enough to undo;
        this term weighs exactly that component of the error again (assets/avatar/
        MODEL_CARD.md)."""
        e, g = self.pred.float() - self.target, self.base - self.target
        w = self.weight.expand_as(self.pred)
        num = (w * e * g).flatten(2).sum(-1)
        den = (w * g * g).flatten(2).sum(-1).clamp_min(1e-6)
        return (num.clamp_min(0) ** 2 / den).sum()


#: the largest share of the memory base blended into a ghosted clip (``world_prediction``'s
#: ``p_ghost``): the avatar's turned heads came out about 70 % the head at rest
GHOST_MAX = 0.7

#: the world model's training losses (:meth:`WorldPrediction.loss`)
LOSSES = ("mse", "l1")


def ghost_inputs(z: torch.Tensor, zb: torch.Tensor, gen: torch.Generator,
                 p: float) -> torch.Tensor:
    """Clips ``z (B, F, C, h, w)`` with, in a fraction ``p`` of them, their memory bases ``zb``
    (same shape) blended into every frame: ``z - β (z - zb)``, β ~ U[0, GHOST_MAX] drawn once
    a clip (:func:`world_prediction`'s ``p_ghost``)."""
    b = z.shape[0]
    beta = (torch.rand(b, generator=gen) < p) * torch.rand(b, generator=gen) * GHOST_MAX
    return z - beta.to(z.device)[:, None, None, None, None] * (z - zb)


def world_loss(*args, loss: str = "mse", ghost_weight: float = 0.0, **kwargs) -> torch.Tensor:
    """:func:`world_prediction`'s weighted error (``loss``, ``ghost_weight``: see
    :meth:`WorldPrediction.loss`; the recipe's is the squared error alone); the other
    arguments are :func:`world_prediction`'s."""
    return world_prediction(*args, **kwargs).loss(loss, ghost_weight)


def world_prediction(
    model: WorldDiT,
    lat: torch.Tensor,
    base: torch.Tensor,
    known: torch.Tensor,
    actions: torch.Tensor,
    txt: torch.Tensor,
    gen: torch.Generator,
    chunk_frames: int,
    ctx_sigma_max: float,
    ctx: DenseContext,
    device: torch.device,
    p_context: float = 0.9,
    new_weight: float = 4.0,
    p_degrade: float = 0.3,
    change_weight: float = 0.0,
    skip: torch.Tensor | None = None,
    pose: torch.Tensor | None = None,
    p_ghost: float = 0.0,
) -> WorldPrediction:
    """The forward of the flow-matching x0 loss over a clip: ``lat``/``base (B, F, C, h, w)``
    autoencoder latents of the frames and of their memory bases, ``known (B, F, 2, h, w)``,
    ``actions (B, F)``, ``txt (B, F, 384)``. Squared error weighted ``1 + new_weight`` where
    memory held nothing of the current prompt (what the model must generate), 1 where it only
    copies, plus ``change_weight`` times :func:`change_map` (where the frame differs from its
    base). A fraction ``p_degrade`` of the bases is degraded first (:func:`degrade_bases`).
    ``skip (B, F, C, h, w)``: raw latents of each frame's second skip source for a model with
    ``skip_source`` (:func:`recipe_clips`, fed as :func:`noised_skip`; a previous frame is
    degraded as the bases are); ``pose (B, F, 2)``:
    the rig's pose for a model with ``pose_path``. ``p_ghost``: the fraction of clips whose
    frames are fed (as context and as noisy targets alike) with their memory base blended in,
    ``z - β (z - base)``, β ~ U[0, GHOST_MAX] per clip, while the loss still asks for the true
    frames: where the model's own frames carry a ghost of the picture in memory (the avatar's
    head at rest under a turned one), a stream feeds it that ghost back, and training on
    ghost-free context only taught it to copy its context (error injection, as in Stable
    Video Infinity's error recycling, Li et al. 2025)."""
    b, f = actions.shape
    nc = f // chunk_frames
    z = model.normalize(lat.to(device))
    zb = clean = model.normalize(base.to(device))
    change = change_map(z, zb) if change_weight else None
    sig = sample_chunk_sigmas(gen, b, nc, ctx_sigma_max, p_context)
    sig = sig.repeat_interleave(chunk_frames, dim=1).to(device)
    z_in = ghost_inputs(z, zb, gen, p_ghost) if p_ghost else z
    zb = degrade_bases(zb, gen, p_degrade)
    base_sig = (torch.rand(b, f, generator=gen) * ctx_sigma_max).to(device)
    bs = base_sig[..., None, None, None]
    zb = (1 - bs) * zb + bs * torch.randn(zb.shape, generator=gen).to(device)
    txt = txt.to(device) * (torch.rand(b, 1, 1, generator=gen) >= 0.1).to(device)
    offset = torch.randint(0, 1000, (b, 1), generator=gen)
    pos = (offset + torch.arange(f)[None]).to(device)
    s = sig[..., None, None, None]
    cfg = model.config
    noise = training_noise(z.shape, gen, cfg.noise_correlation, cfg.noise_scale)
    x = (1 - s) * z_in + s * noise.to(device)
    known = known.to(device)
    zs = noised_skip(model, skip, gen, base_sig,
                     p_degrade if model.config.skip_source == "previous" else 0.0, device)
    with autocast(device):
        pred = model(x, zb, base_sig, known, sig, actions.to(device), txt, pos, ctx, skip=zs,
                     pose=None if pose is None else pose.to(device))
    # NOTE: most of a frame is remembered ground the model only has to copy; without weighting,
    # the few percent it must generate (new ground at the border, the sprite, restyled ground)
    # were a few percent of the loss, and at step 500 new ground came out in no scene's colours
    weight = 1.0 + new_weight * (1.0 - known[:, :, :1])
    if change is not None:
        weight = weight + change_weight * change
    return WorldPrediction(pred, z, weight, sig, known, txt, clean)


def change_map(z: torch.Tensor, zb: torch.Tensor, cap: float = 10.0) -> torch.Tensor:
    """``(B, F, 1, h, w)`` how much each latent pixel of the frames ``z`` differs from their
    clean bases ``zb`` (both ``(B, F, C, h, w)``, normalised): the channel-mean absolute
    difference over its batch mean, capped at ``cap``.

    NOTE: where the camera stands still (the avatar world), memory keeps the stream's first
    frame (a pixel is rewritten only by a better view) and a model that copies that base is
    right almost everywhere: the head turn, the expression and the open mouth are a few
    percent of the pixels, and at step 6,000 the model still mostly copied (expression 0.265,
    lip-sync 0.435). Weighting the loss by the change puts the action's effect back in
    proportion (as ``new_weight`` does for new ground): 2,000 steps from those weights gave
    expression 0.51 against 0.36 unweighted (``assets/avatar/MODEL_CARD.md``)."""
    d = (z - zb).abs().mean(dim=2, keepdim=True)
    return (d / d.mean().clamp_min(1e-6)).clamp(max=cap)


def resume_run(model: WorldDiT, lr: float, warmup: int, ckpt_path: Path,
               device: torch.device) -> tuple:
    """The training state of a world-model run: the camera dynamics frozen (fitted once, on
    the camera paths alone), AdamW with warmup, an EMA of the weights (diffusers
    ``EMAModel``), all resumed from ``ckpt_path`` when it exists (:func:`save_run`). Returns
    ``(params, ema, opt, sched, step, wall_s)``."""
    model.camera.requires_grad_(False)
    params = [p for p in model.parameters() if p.requires_grad]
    ema = EMAModel(params, decay=0.999)
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.01)
    sched = get_constant_schedule_with_warmup(opt, warmup)
    step, wall = 0, 0.0
    if (ck := load_checkpoint(ckpt_path)) is not None:
        model.load_state_dict(ck["model"])
        ema.load_state_dict(ck["ema"])
        opt.load_state_dict(ck["opt"])
        sched.load_state_dict(ck["sched"])
        step, wall = ck["step"], ck["wall"]
    ema.to(device)
    return params, ema, opt, sched, step, wall


def save_run(path: Path, model, ema, opt, sched, step: int, wall_s: float, **extra) -> None:
    """The resume checkpoint of a world-model run (weights, EMA, optimiser, schedule, and
    ``extra`` entries a fine-tune keeps beside them)."""
    save_checkpoint(path, model=model.state_dict(), ema=ema.state_dict(), opt=opt.state_dict(),
                    sched=sched.state_dict(), step=step, wall=wall_s, **extra)


def export_ema(model: WorldDiT, ema: EMAModel, params: list, out_dir: Path) -> None:
    """Save the EMA weights (diffusers ``save_pretrained``), leaving the training weights."""
    ema.store(params)
    ema.copy_to(params)
    model.save_pretrained(out_dir)
    ema.restore(params)


def latent_stats(data: LatentDataset) -> tuple[list[float], list[float]]:
    flat = data.latents[:, ::4].float().transpose(0, 2).reshape(data.latents.shape[2], -1)
    return flat.mean(1).tolist(), flat.std(1).tolist()


def pose_window_mask(pose: torch.Tensor, chunk_frames: int, tolerance: float) -> torch.Tensor:
    """``(B, L, L)`` bool frame mask for clips posed ``pose (B, L, 2)`` (yaw, pitch): frame i
    may attend frame j iff j's chunk is i's or an earlier one whose frames are all posed
    within ``tolerance`` of the first frame of i's chunk (the larger of the yaw and pitch
    differences) — what a stream with ``BuiltinConfig.window_pose_tolerance`` attends."""
    b, length, _ = pose.shape
    chunk = torch.arange(length) // chunk_frames
    first = pose[:, chunk * chunk_frames]  # (B, L, 2) the first frame of each frame's chunk
    near = (pose[:, None, :, :] - first[:, :, None, :]).abs().amax(-1) <= tolerance + 1e-9
    # a chunk is attended whole or not at all: all its frames near
    near_chunk = near.view(b, length, length // chunk_frames, chunk_frames).all(-1)
    near = near_chunk.repeat_interleave(chunk_frames, dim=2)
    same = chunk[None, :] == chunk[:, None]
    return (chunk[None, :] < chunk[:, None]) & near | same


def train_world(
    data: LatentDataset,
    out_dir: Path,
    run_dir: Path,
    *,
    steps: int,
    batch: int = 16,
    frames: int = 8,
    chunk_frames: int = 1,
    dim: int = 128,
    depth: int = 6,
    num_heads: int = 4,
    lr: float = 3e-4,
    ctx_sigma_max: float = 0.15,
    seed: int = 0,
    ckpt_every: int = 100,
    export_every: int = 500,
    max_minutes: float | None = None,
    init_from: Path | None = None,
    p_context: float = 0.9,
    camera_steps: int = 300,
    view_box: int = VIEW_BOX,
    num_actions: int = 9,
    action_factors: tuple[int, ...] | None = None,
    change_weight: float = 0.0,
    base_warp: str | None = None,
    skip_source: str | None = None,
    pose_path: str | None = None,
    skip_prior: float = 0.0,
    skip_floor: float | None = None,
    backdrop_fill: bool = False,
    loss: str = "mse",
    ghost_weight: float = 0.0,
    p_ghost: float = 0.0,
    pose_window_tolerance: float | None = None,
    noise_correlation: float = 0.0,
    noise_scale: float = 2.0,
) -> dict:
    """Train or resume up to ``steps`` steps (or ``max_minutes`` of wall time this call).

    ``init_from``: a saved WorldDiT of the same shape to warm-start a fresh run from (one
    without ``skip_source`` or ``pose_path`` may start one with them: :func:`warm_start`).
    ``skip_source``: a second skip source (``WorldDiT``'s; ``"warped"`` needs ``data.skip``).
    ``pose_path``: condition each frame on that rig's pose (``WorldDiT``'s ``pose_path``).
    ``skip_prior``: the mixing map's offset (``WorldDiT``'s; 1.0 starts trusting the source);
    ``skip_floor``: the map's lower bound (``WorldDiT``'s; None: unbounded).
    ``backdrop_fill``: ``data.skip`` shows the background plate where a turn uncovers it
    (``WorldDiT``'s; recorded in the model's config so that the engine does the same).
    ``change_weight``: see :func:`world_loss` (0 for the landscape recipe). ``loss``: "mse"
    (the recipe) or "l1" (:meth:`WorldPrediction.loss`); ``ghost_weight``: the weight of
    :meth:`WorldPrediction.ghost_error` beside it (0 for both worlds' recipes). ``p_ghost``: see
    :func:`world_prediction` (0 for both worlds' recipes). ``pose_window_tolerance``: with
    ``pose_path``, each frame attends only the earlier frames of its clip posed within this
    of it (:func:`pose_window_mask`), as a stream with ``BuiltinConfig.window_pose_tolerance``
    runs (None: block-causal). ``noise_correlation``, ``noise_scale``: the denoising noise
    (``WorldDiT``'s config of the same names; 0: white, the recipe).
    ``view_box``, ``num_actions``, ``action_factors``, ``base_warp``: the world's
    (``engine.worlds.catalog``; ``data``'s bases must have been encoded with that warp).
    """
    if frames % chunk_frames:
        raise ValueError(f"frames ({frames}) must be a multiple of chunk_frames ({chunk_frames})")
    if loss not in LOSSES:
        raise ValueError(f"loss must be one of {LOSSES}, got {loss!r}")
    if not 0.0 <= p_ghost <= 1.0:
        raise ValueError(f"p_ghost must be in [0, 1], got {p_ghost}")
    if ghost_weight < 0:
        raise ValueError(f"ghost_weight must be >= 0, got {ghost_weight}")
    if pose_window_tolerance is not None and (pose_window_tolerance < 0 or pose_path is None):
        raise ValueError("pose_window_tolerance must be >= 0 and needs a pose_path, got "
                         f"{pose_window_tolerance} with pose_path {pose_path!r}")
    device = pick_device()
    seed_everything(seed)
    mean, std = latent_stats(data)
    latent_size = data.latents.shape[-1]
    model = WorldDiT(
        latent_channels=data.latents.shape[2],
        latent_size=latent_size,
        patch_size=latent_size // 8,  # 8 x 8 tokens per frame
        dim=dim,
        depth=depth,
        num_heads=num_heads,
        chunk_frames=chunk_frames,
        latent_mean=tuple(mean),
        latent_std=tuple(std),
        view_box=view_box,
        num_actions=num_actions,
        action_factors=action_factors,
        base_warp=base_warp,
        skip_source=skip_source,
        pose_path=pose_path,
        skip_prior=skip_prior,
        skip_floor=skip_floor,
        backdrop_fill=backdrop_fill,
        noise_correlation=noise_correlation,
        noise_scale=noise_scale,
    ).to(device)
    if pose_path is not None:
        attach_poses(data, make_base_warp(pose_path, model.config.image_size))
    ckpt_path = run_dir / "world_checkpoint.pt"
    fresh = not ckpt_path.exists()
    if init_from is not None and fresh:
        warm_start(model, WorldDiT.from_pretrained(init_from).state_dict())
    elif fresh:
        rms = fit_camera_dynamics(model.camera, data.camera, data.actions, camera_steps)
        tqdm.write(f"camera dynamics fitted: RMS position error {rms:.2f} px")
    params, ema, opt, sched, step, wall = resume_run(model, lr, 200, ckpt_path, device)
    rng = np.random.default_rng([seed, step])
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
    ctx = DenseContext(
        expand_frame_mask(block_causal_frame_mask(frames, chunk_frames), model.tokens_per_frame).to(
            device
        )
    )
    t0 = time.perf_counter()
    losses: list[float] = []

    def checkpoint() -> None:
        save_run(ckpt_path, model, ema, opt, sched, step, wall + time.perf_counter() - t0)

    def export() -> None:
        export_ema(model, ema, params, out_dir)

    bar = tqdm(total=steps, initial=step, desc="train-world", unit="step")
    while step < steps:
        if max_minutes is not None and time.perf_counter() - t0 > 60 * max_minutes:
            break
        lat, base, known, actions, txt, skip, pose = recipe_clips(data, rng, batch, frames,
                                                                  chunk_frames, skip_source)
        step_ctx = ctx
        if pose_window_tolerance is not None:
            step_ctx = DenseContext(expand_frame_mask(
                pose_window_mask(pose, chunk_frames, pose_window_tolerance),
                model.tokens_per_frame)[:, None].to(device))
        step_loss = world_loss(
            model, lat, base, known, actions, txt, gen, chunk_frames, ctx_sigma_max, step_ctx,
            device, p_context, change_weight=change_weight, skip=skip, pose=pose, loss=loss,
            ghost_weight=ghost_weight, p_ghost=p_ghost,
        )
        opt.zero_grad(set_to_none=True)
        step_loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        ema.step(params)
        step += 1
        losses.append(step_loss.item())
        bar.update(1)
        bar.set_postfix(loss=f"{np.mean(losses[-50:]):.4f}")
        if step % ckpt_every == 0:
            checkpoint()
            bar.write(f"step {step}: loss {np.mean(losses[-ckpt_every:]):.4f}")
        if step % export_every == 0:
            export()
    bar.close()
    checkpoint()
    export()
    result = {
        "steps": step,
        "final_loss": float(np.mean(losses[-100:])) if losses else None,
        "wall_s": round(wall + time.perf_counter() - t0, 1),
    }
    (run_dir / "world_result.json").write_text(json.dumps(result))
    return result
