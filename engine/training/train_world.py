"""Train the built-in world model (``worldstream train-world``).

Flow matching on normalised autoencoder latents, x_σ = (1 - σ)·x0 + σ·ε, the network predicting
x0. Clips of ``frames`` frames in chunks of ``chunk_frames``; block-causal attention; an
independent noise level per chunk (Diffusion Forcing), drawn logit-normal (SD3). Half of the
batches are inference-like: the chunks before a random chunk k are noise-augmented context at a
small level σ ~ U[0, ctx_sigma_max] (GameNGen/DIAMOND context noise; the level is conditioning),
so the model learns to continue from the cache-filled context it sees when streaming. Text
embeddings are dropped 10% of the time. AdamW with warmup, EMA of the weights (diffusers
``EMAModel``); checkpoints every ``ckpt_every`` steps for resume; EMA weights exported to
``out_dir`` with ``save_pretrained``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import torch
from diffusers.optimization import get_constant_schedule_with_warmup
from diffusers.training_utils import EMAModel
from tqdm import tqdm

from engine.models.attention import DenseContext, block_causal_frame_mask, expand_frame_mask
from engine.models.world_dit import WorldDiT
from engine.training.common import (
    autocast,
    load_checkpoint,
    pick_device,
    save_checkpoint,
    seed_everything,
)
from engine.training.latents import LatentDataset
from engine.worlds.simulator import SIZE as IMAGE_SIZE


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


def _previous_index(frames: int, chunk_frames: int) -> torch.Tensor:
    """``(F,)`` index of the frame fed as ``prev`` to each frame: the last frame of the
    previous chunk (-1 for chunk 0)."""
    return torch.arange(frames) // chunk_frames * chunk_frames - 1


def previous_frames(x: torch.Tensor, sigma: torch.Tensor, chunk_frames: int):
    """The frame fed to every frame of chunk c: the last frame of chunk c-1 as the model sees it
    (zeros with σ = 1 for chunk 0). ``x (B, F, C, h, w)``, ``sigma (B, F)``."""
    b, f = sigma.shape
    last = _previous_index(f, chunk_frames)
    prev = x[:, last.clamp(min=0)].clone()
    prev_sigma = sigma[:, last.clamp(min=0)].clone()
    prev[:, last < 0] = 0.0
    prev_sigma[:, last < 0] = 1.0
    return prev, prev_sigma


def camera_motion_target(camera: torch.Tensor, chunk_frames: int, latent_scale: float):
    """Ground-truth displacement of each frame from its ``prev`` frame.

    ``camera (B, F, 2)`` crop origins in image pixels -> ``(B, F, 2)`` displacement in latent
    pixels (image pixels / ``latent_scale``) and a ``(F,)`` bool mask of frames that have a
    ``prev`` (chunk 0 has none)."""
    last = _previous_index(camera.shape[1], chunk_frames)
    target = (camera - camera[:, last.clamp(min=0)]) / latent_scale
    return target, last >= 0


def generated_chunk(
    model: WorldDiT,
    z: torch.Tensor,
    k: torch.Tensor,
    gen: torch.Generator,
    chunk_frames: int,
    cond: tuple,
) -> torch.Tensor:
    """``z (B, F, C, h, w)`` with chunk ``k[b]`` of each row replaced by the model's own one-step
    prediction of it (no gradient) from the clean chunks before it and chunk k at a noise level
    U[0.5, 1]: the degraded, model-made context a free rollout feeds the next chunk.
    ``cond`` = (actions, text, positions, attention context) of the clip."""
    b, f = z.shape[:2]
    chunk = (torch.arange(f) // chunk_frames)[None].to(z.device)
    level = 0.5 + 0.5 * torch.rand(b, 1, generator=gen).to(z.device)
    sig = torch.where(chunk < k[:, None], 0.0, torch.where(chunk == k[:, None], level, 1.0))
    s = sig[..., None, None, None]
    x = (1 - s) * z + s * torch.randn(z.shape, generator=gen).to(z.device)
    prev, prev_sigma = previous_frames(x, sig, chunk_frames)
    with torch.no_grad(), autocast(z.device):
        pred = model(x, prev, prev_sigma, sig, *cond).float()
    return torch.where((chunk == k[:, None])[..., None, None, None], pred, z)


def world_loss(
    model: WorldDiT,
    lat: torch.Tensor,
    actions: torch.Tensor,
    txt: torch.Tensor,
    camera: torch.Tensor,
    gen: torch.Generator,
    chunk_frames: int,
    ctx_sigma_max: float,
    ctx: DenseContext,
    device: torch.device,
    p_context: float = 0.9,
    motion_weight: float = 1.0,
    p_generated: float = 0.0,
) -> torch.Tensor:
    """Flow-matching x0 loss over the clip; with ``motion_warp`` plus ``motion_weight`` × the
    squared error of the predicted camera displacement against the simulator's camera path
    (``camera (B, F, 2)`` image px).

    In a fraction ``p_generated`` of the rows, chunk k (random, not the last) is replaced by the
    model's own prediction (:func:`generated_chunk`) and chunks 0..k become context: the model
    learns to continue from, and correct, its own blurred output, as it must in a free rollout
    (scheduled sampling, Bengio et al. 2015; the exposure-bias problem Self-Forcing targets)."""
    b, f = actions.shape
    nc = f // chunk_frames
    z = model.normalize(lat.to(device))
    sig = sample_chunk_sigmas(gen, b, nc, ctx_sigma_max, p_context)
    rows = (torch.rand(b, generator=gen) < p_generated) & (nc >= 2)
    k = torch.randint(0, max(nc - 1, 1), (b,), generator=gen)
    ctx_sig = torch.rand(b, nc, generator=gen) * ctx_sigma_max
    sig = torch.where(rows[:, None] & (torch.arange(nc)[None] <= k[:, None]), ctx_sig, sig)
    sig = sig.repeat_interleave(chunk_frames, dim=1).to(device)
    noise = torch.randn(z.shape, generator=gen).to(device)
    txt = txt.to(device) * (torch.rand(b, 1, 1, generator=gen) >= 0.1).to(device)
    offset = torch.randint(0, 1000, (b, 1), generator=gen)
    pos = (offset + torch.arange(f)[None]).to(device)
    actions = actions.to(device)
    clean = z
    if rows.any():
        clean = z.clone()
        r = rows.to(device)
        clean[r] = generated_chunk(
            model, z[r], k[rows].to(device), gen, chunk_frames, (actions[r], txt[r], pos[r], ctx)
        )
    s = sig[..., None, None, None]
    x = (1 - s) * clean + s * noise
    prev, prev_sigma = previous_frames(x, sig, chunk_frames)
    with autocast(device):
        pred, motion = model(x, prev, prev_sigma, sig, actions, txt, pos, ctx, return_motion=True)
    loss = torch.mean((pred - z) ** 2)
    if model.config.motion_warp:
        scale = IMAGE_SIZE / model.config.latent_size
        target, has_prev = camera_motion_target(camera.to(device), chunk_frames, scale)
        loss = loss + motion_weight * torch.mean((motion - target)[:, has_prev] ** 2)
    return loss


def latent_stats(data: LatentDataset) -> tuple[list[float], list[float]]:
    flat = data.latents[:, ::4].float().transpose(0, 2).reshape(data.latents.shape[2], -1)
    return flat.mean(1).tolist(), flat.std(1).tolist()


def train_world(
    data: LatentDataset,
    out_dir: Path,
    run_dir: Path,
    *,
    steps: int,
    batch: int = 16,
    frames: int = 8,
    chunk_frames: int = 2,
    dim: int = 128,
    depth: int = 6,
    num_heads: int = 4,
    lr: float = 3e-4,
    ctx_sigma_max: float = 0.15,
    seed: int = 0,
    ckpt_every: int = 100,
    export_every: int = 500,
    max_minutes: float | None = None,
    residual: bool = False,
    motion_warp: bool = False,
    init_from: Path | None = None,
    p_context: float = 0.9,
    p_generated: float = 0.0,
) -> dict:
    """Train or resume up to ``steps`` steps (or ``max_minutes`` of wall time this call).

    ``init_from``: a saved WorldDiT to warm-start a fresh run from (its output layer is zeroed
    when switching to ``residual``, so training starts from "copy the previous frame")."""
    if frames % chunk_frames:
        raise ValueError(f"frames ({frames}) must be a multiple of chunk_frames ({chunk_frames})")
    device = pick_device()
    seed_everything(seed)
    mean, std = latent_stats(data)
    model = WorldDiT(
        dim=dim,
        depth=depth,
        num_heads=num_heads,
        chunk_frames=chunk_frames,
        latent_channels=data.latents.shape[2],
        latent_mean=tuple(mean),
        latent_std=tuple(std),
        residual=residual,
        motion_warp=motion_warp,
    ).to(device)
    if init_from is not None and not (run_dir / "world_checkpoint.pt").exists():
        warm = WorldDiT.from_pretrained(init_from)
        # a warm start without a motion head keeps this model's zero-initialised one
        missing, unexpected = model.load_state_dict(warm.state_dict(), strict=False)
        if unexpected or any(not k.startswith("motion.") for k in missing):
            raise ValueError(f"{init_from}: weights do not fit this model ({missing=}, "
                             f"{unexpected=})")
        if residual and not warm.config.residual:
            torch.nn.init.zeros_(model.out.weight)
            torch.nn.init.zeros_(model.out.bias)
    ema = EMAModel(model.parameters(), decay=0.999)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    sched = get_constant_schedule_with_warmup(opt, 200)
    step, wall = 0, 0.0
    ckpt_path = run_dir / "world_checkpoint.pt"
    if (ck := load_checkpoint(ckpt_path)) is not None:
        model.load_state_dict(ck["model"])
        ema.load_state_dict(ck["ema"])
        opt.load_state_dict(ck["opt"])
        sched.load_state_dict(ck["sched"])
        step, wall = ck["step"], ck["wall"]
    ema.to(device)
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
        save_checkpoint(
            ckpt_path,
            model=model.state_dict(),
            ema=ema.state_dict(),
            opt=opt.state_dict(),
            sched=sched.state_dict(),
            step=step,
            wall=wall + time.perf_counter() - t0,
        )

    def export() -> None:
        ema.store(model.parameters())
        ema.copy_to(model.parameters())
        model.save_pretrained(out_dir)
        ema.restore(model.parameters())

    bar = tqdm(total=steps, initial=step, desc="train-world", unit="step")
    while step < steps:
        if max_minutes is not None and time.perf_counter() - t0 > 60 * max_minutes:
            break
        lat, actions, txt, camera = data.sample(rng, batch, frames)
        loss = world_loss(
            model, lat, actions, txt, camera, gen, chunk_frames, ctx_sigma_max, ctx, device,
            p_context, p_generated=p_generated,
        )
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        ema.step(model.parameters())
        step += 1
        losses.append(loss.item())
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
