"""Adversarial post-training of the built-in world model (``train-world --adversarial W``).

Why: the model is trained to predict x0 under a squared error, whose optimum is the mean of
what could be there. Where nothing tells what lies there — new ground at a frame border — that
mean is a blur, and few-step samples of it came out as mottle and streaks
(``assets/builtin/MODEL_CARD.md``); supervising the model's own rollouts against the
simulator (``engine.training.onpolicy``) regressed new ground to the same mean. A
discriminator asks instead whether a prediction *looks like* a frame of the world, which a
plausible ground that is not the simulator's passes. The recipe follows adversarial diffusion
distillation (Sauer et al., "Adversarial Diffusion Distillation", 2023: the student's x0
predictions from noised real data judged against real data, beside a reconstruction term) and
adversarial post-training of video diffusion (Lin et al., "Diffusion Adversarial Post-Training
for One-Step Video Generation", 2025), at this model's scale: the discriminator is a small
patch discriminator on the model-space latents (no decode in the loop), conditioned on the
prompt by projection (Miyato & Koyama, "cGANs with Projection Discriminator", 2018), with
spectral normalisation (Miyato et al., 2018) and the hinge loss (Lim & Ye, "Geometric GAN",
2017). The squared error of the original recipe (:func:`~engine.training.train_world.world_loss`)
stays in the generator's loss and keeps remembered ground, colours and actions anchored.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.parametrizations import spectral_norm
from tqdm import tqdm

from worldstream.engine.models.builtin.attention import (
    DenseContext,
    block_causal_frame_mask,
    expand_frame_mask,
)
from worldstream.engine.models.builtin.world_dit import WorldDiT
from worldstream.engine.training.common import load_checkpoint, pick_device, seed_everything
from worldstream.engine.training.latents import LatentDataset, attach_poses
from worldstream.engine.training.train_world import (
    WorldPrediction,
    export_ema,
    recipe_clips,
    resume_run,
    save_run,
    world_prediction,
)
from worldstream.engine.worlds.catalog import make_base_warp


class PatchDiscriminator(nn.Module):
    """Projection patch discriminator on model-space latents.

    ``forward(z (N, C, h, w), txt (N, text_dim)) -> (N, h/4, w/4)`` float32 logits, one per
    patch (receptive field 20 latent pixels, 80 image pixels of a 128-px frame: it sees new
    ground together with the remembered ground beside it). Three spectrally normalised
    convolutions, then a 1-channel head plus the projection ``<embed(txt), features>`` per patch
    (no bias: a zero text, the dropped prompt, leaves the unconditional head)."""

    def __init__(self, channels: int = 4, width: int = 64, text_dim: int = 384):
        super().__init__()
        self.body = nn.Sequential(
            spectral_norm(nn.Conv2d(channels, width, 3, 1, 1)),
            nn.LeakyReLU(0.2),
            spectral_norm(nn.Conv2d(width, 2 * width, 4, 2, 1)),
            nn.LeakyReLU(0.2),
            spectral_norm(nn.Conv2d(2 * width, 2 * width, 4, 2, 1)),
            nn.LeakyReLU(0.2),
        )
        self.head = spectral_norm(nn.Conv2d(2 * width, 1, 3, 1, 1))
        self.embed = spectral_norm(nn.Linear(text_dim, 2 * width, bias=False))

    def forward(self, z: torch.Tensor, txt: torch.Tensor) -> torch.Tensor:
        h = self.body(z.float())
        proj = torch.einsum("nchw,nc->nhw", h, self.embed(txt.float()))
        return self.head(h)[:, 0] + proj


def hinge_d_loss(real: torch.Tensor, fake: torch.Tensor) -> torch.Tensor:
    """The discriminator's hinge loss, ``mean(relu(1 - real)) + mean(relu(1 + fake))`` over
    logits of any shape (Lim & Ye 2017): 0 once real patches score >= 1 and fakes <= -1."""
    return F.relu(1.0 - real).mean() + F.relu(1.0 + fake).mean()


def hinge_g_loss(fake: torch.Tensor) -> torch.Tensor:
    """The generator's hinge loss, ``-mean(fake)``: raise the discriminator's score of its
    predictions."""
    return -fake.mean()


def judged_frames(pred: WorldPrediction, min_sigma: float, *, pose: torch.Tensor | None = None,
                  min_pose: float = 0.0, box: tuple[int, int, int, int] | None = None):
    """The frames of a :class:`~engine.training.train_world.WorldPrediction` the discriminator
    judges: those denoised from ``sigma >= min_sigma`` (what the model generates; context
    frames at the context noise level are near copies of their input) and, with ``pose (B, F,
    2)`` (the rig's pose of each frame, :func:`~engine.training.latents.attach_poses`), only
    those posed at least ``min_pose`` from rest (largest absolute component); ``box = (top,
    left, height, width)`` in latent pixels crops each to that region (the avatar's head: a
    turn's second face is judged there, not the background's pixels). Returns ``(fake, real,
    txt)`` as ``(N, C, h, w)`` (``h, w`` the box's when given), ``(N, C, h, w)``, ``(N,
    text_dim)``; N may be 0. ValueError for a ``min_pose`` without ``pose``, or a box outside
    the latent frame."""
    pick = pred.sigma >= min_sigma
    if min_pose > 0:
        if pose is None:
            raise ValueError("min_pose needs the frames' poses")
        pick = pick & (pose.abs().amax(dim=-1) >= min_pose).to(pick.device)
    fake, real = pred.pred[pick], pred.target[pick]
    if box is not None:
        top, left, height, width = box
        h, w = fake.shape[-2:]
        if min(top, left) < 0 or height < 1 or width < 1 or top + height > h or left + width > w:
            raise ValueError(f"box {box} is not inside the {h}x{w} latent frame")
        fake = fake[..., top:top + height, left:left + width]
        real = real[..., top:top + height, left:left + width]
    return fake, real, pred.txt[pick]


def finetune_adversarial(
    data: LatentDataset,
    init_from: Path,
    out_dir: Path,
    run_dir: Path,
    *,
    steps: int,
    adv_weight: float = 0.1,
    lr: float = 1e-4,
    d_lr: float = 2e-4,
    d_warmup: int = 100,
    min_sigma: float = 0.25,
    batch: int = 16,
    frames: int = 8,
    ctx_sigma_max: float = 0.3,
    change_weight: float = 0.0,
    judge_min_pose: float = 0.0,
    judge_box: tuple[int, int, int, int] | None = None,
    seed: int = 0,
    ckpt_every: int = 100,
    export_every: int = 250,
    max_minutes: float | None = None,
) -> dict:
    """Fine-tune a trained :class:`WorldDiT` (``init_from``) with the original recipe's loss
    plus ``adv_weight`` times the generator's hinge loss against a :class:`PatchDiscriminator`
    trained beside it; resumable from ``run_dir/adversarial_checkpoint.pt``.

    Each step: one forward of the recipe (:func:`world_prediction`, ``change_weight`` as
    there), the generator's loss ``mse + adv_weight * hinge_g`` on the frames
    :func:`judged_frames` picks (``judge_min_pose``, ``judge_box``: only frames posed that far
    from rest, cropped to that latent box; the avatar's turned heads), the adversarial term
    only after ``d_warmup`` steps, so the discriminator has learned something before its
    gradient reaches the model; then one discriminator step on the same frames (real: the
    true latents; fake: the detached predictions). AdamW for the model (the recipe's, with an
    EMA, the camera frozen), Adam (betas 0, 0.99: GAN practice) for the discriminator. The
    EMA weights are exported to ``out_dir`` (``save_pretrained``) every ``export_every`` steps
    and at the end; a log line per ``ckpt_every`` steps goes to
    ``run_dir/adversarial_log.jsonl``. ValueError for a negative ``adv_weight``, or a
    ``judge_min_pose`` for a model without a pose path."""
    if adv_weight < 0:
        raise ValueError(f"adv_weight must be >= 0, got {adv_weight}")
    device = pick_device()
    seed_everything(seed)
    model = WorldDiT.from_pretrained(init_from).to(device)
    if judge_min_pose > 0 and model.config.pose_path is None:
        raise ValueError(f"{init_from} has no pose path: its frames have no pose to judge by")
    if model.config.pose_path is not None:
        attach_poses(data, make_base_warp(model.config.pose_path, model.config.image_size))
    disc = PatchDiscriminator(model.config.latent_channels, text_dim=model.config.text_dim)
    disc = disc.to(device)
    d_opt = torch.optim.Adam(disc.parameters(), lr=d_lr, betas=(0.0, 0.99))
    ckpt_path = run_dir / "adversarial_checkpoint.pt"
    params, ema, opt, sched, step, wall = resume_run(model, lr, 50, ckpt_path, device)
    if (ck := load_checkpoint(ckpt_path)) is not None:
        disc.load_state_dict(ck["disc"])
        d_opt.load_state_dict(ck["d_opt"])
    rng = np.random.default_rng([seed, step, 41])
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step + 41)
    chunk = model.config.chunk_frames
    ctx = DenseContext(
        expand_frame_mask(block_causal_frame_mask(frames, chunk), model.tokens_per_frame).to(device)
    )
    run_dir.mkdir(parents=True, exist_ok=True)
    log = (run_dir / "adversarial_log.jsonl").open("a")
    t0 = time.perf_counter()

    def checkpoint() -> None:
        save_run(ckpt_path, model, ema, opt, sched, step, wall + time.perf_counter() - t0,
                 disc=disc.state_dict(), d_opt=d_opt.state_dict())

    rows: list[tuple[float, float, float, float, float]] = []
    bar = tqdm(total=steps, initial=step, desc="train-world adversarial", unit="step")
    while step < steps:
        if max_minutes is not None and time.perf_counter() - t0 > 60 * max_minutes:
            break
        model.train()
        lat, base, known, actions, txt, skip, pose = recipe_clips(
            data, rng, batch, frames, chunk, model.config.skip_source)
        pred = world_prediction(model, lat, base, known, actions, txt, gen, chunk,
                                ctx_sigma_max, ctx, device, change_weight=change_weight,
                                skip=skip, pose=pose)
        mse = pred.loss()
        fake, real, ftxt = judged_frames(pred, min_sigma, pose=pose, min_pose=judge_min_pose,
                                         box=judge_box)
        g_adv = torch.zeros((), device=device)
        if step >= d_warmup and len(fake):
            disc.requires_grad_(False)
            g_adv = hinge_g_loss(disc(fake, ftxt))
            disc.requires_grad_(True)
        opt.zero_grad(set_to_none=True)
        (mse + adv_weight * g_adv).backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        ema.step(params)
        d_loss = d_real = d_fake = float("nan")
        if len(fake):
            lr_, lf_ = disc(real, ftxt), disc(fake.detach(), ftxt)
            loss_d = hinge_d_loss(lr_, lf_)
            d_opt.zero_grad(set_to_none=True)
            loss_d.backward()
            d_opt.step()
            d_loss, d_real, d_fake = loss_d.item(), lr_.mean().item(), lf_.mean().item()
        step += 1
        rows.append((mse.item(), g_adv.item(), d_loss, d_real, d_fake))
        bar.update(1)
        recent = np.nanmean(np.array(rows[-50:]), axis=0)
        bar.set_postfix(mse=f"{recent[0]:.4f}", g=f"{recent[1]:.3f}", d=f"{recent[2]:.3f}")
        if step % ckpt_every == 0:
            checkpoint()
            avg = np.nanmean(np.array(rows[-ckpt_every:]), axis=0)
            rec = {"step": step, "wall_s": round(wall + time.perf_counter() - t0, 1),
                   **{k: round(float(v), 5) for k, v in
                      zip(("mse", "g_adv", "d_loss", "d_real", "d_fake"), avg)}}
            log.write(json.dumps(rec) + "\n")
            log.flush()
        if step % export_every == 0:
            export_ema(model, ema, params, out_dir)
    bar.close()
    checkpoint()
    export_ema(model, ema, params, out_dir)
    log.close()
    result = {"steps": step, "wall_s": round(wall + time.perf_counter() - t0, 1)}
    (run_dir / "adversarial_result.json").write_text(json.dumps(result))
    return result
