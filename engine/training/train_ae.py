"""Train the built-in autoencoder on simulator frames (``worldstream train-ae``), with one
:class:`~engine.training.config.AEConfig`.

Loss: L1 + MSE on ``decoder(encoder(x))`` (no perceptual network is available offline; GameNGen
tuned its decoder with MSE alone), or MSE alone (``loss="mse"``: the objective PSNR measures).
bf16 autocast, AdamW with warmup + cosine decay (``diffusers.optimization``), optionally an EMA
of the weights (diffusers ``EMAModel``; held out and saved are then the EMA weights), resumable
checkpoints in ``run_dir``; the weights with the best held-out PSNR go to ``out_dir`` in
diffusers ``save_pretrained`` layout.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import torch
from diffusers.optimization import get_cosine_schedule_with_warmup
from diffusers.training_utils import EMAModel
from tqdm import tqdm

from worldstream.engine.models.builtin.autoencoder import (
    build_autoencoder,
    frames_to_tensor,
    psnr_db,
)
from worldstream.engine.training.common import (
    autocast,
    load_checkpoint,
    pick_device,
    save_checkpoint,
    seed_everything,
)
from worldstream.engine.training.config import AEConfig
from worldstream.engine.worlds.recorder import load_shard


def _all_frames(shard_dirs: list[Path]) -> list[np.ndarray]:
    return [load_shard(d)["frames"] for d in shard_dirs]


def _sample(frames: list[np.ndarray], rng: np.random.Generator, batch: int) -> np.ndarray:
    out = []
    for _ in range(batch):
        arr = frames[rng.integers(len(frames))]
        out.append(arr[rng.integers(arr.shape[0]), rng.integers(arr.shape[1])])
    return np.stack(out)


@torch.no_grad()
def heldout_psnr(ae, frames: np.ndarray, device: torch.device) -> float:
    """Mean PSNR (dB) of ``decoder(encoder(x))`` over ``frames (N, 128, 128, 3)`` uint8."""
    ae.eval()
    x = frames_to_tensor(frames).to(device)
    with autocast(device):
        y = torch.cat([ae.decoder(ae.encoder(x[i : i + 64])).float() for i in range(0, len(x), 64)])
    ae.train()
    return psnr_db(y.clamp(-1, 1), x)


def train_ae(
    data_dirs: list[Path],
    heldout_dir: Path,
    out_dir: Path,
    run_dir: Path,
    cfg: AEConfig | None = None,
    *,
    max_minutes: float | None = None,
) -> dict:
    """Train (or resume) with ``cfg`` (default: :class:`AEConfig`'s defaults) and return
    ``{"steps", "heldout_psnr_db", "wall_s"}``; stop after ``cfg.steps`` steps or
    ``max_minutes`` of wall time in this call. ``cfg`` is written as ``train_config.json``
    beside the weights each time they are saved.

    ``decoder_only``: start from the weights in ``init_from`` (else those in ``out_dir``) and
    tune only the decoder, so the latents a world model was trained on stay valid (GameNGen
    tuned its decoder the same way); ``out_dir`` holds the start's weights until a step beats
    them. ``init_from``: warm-start a fresh run from a saved autoencoder (another world's).
    ``ema_decay``: keep an EMA of the trained weights and evaluate and save those.
    """
    cfg = AEConfig() if cfg is None else cfg
    steps, batch, seed, loss, ema_decay = cfg.steps, cfg.batch, cfg.seed, cfg.loss, cfg.ema_decay
    device = pick_device()
    seed_everything(seed)
    if cfg.decoder_only:
        from worldstream.engine.models.builtin.loading import load_autoencoder

        ae = load_autoencoder(Path(cfg.init_from or out_dir)).to(device).train()
        ae.encoder.requires_grad_(False)
        params = list(ae.decoder.parameters())
    else:
        ae = build_autoencoder().to(device)
        if cfg.init_from is not None:
            from worldstream.engine.models.builtin.loading import load_autoencoder

            ae.load_state_dict(load_autoencoder(Path(cfg.init_from)).state_dict())
        params = list(ae.parameters())
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0)
    sched = get_cosine_schedule_with_warmup(opt, 100, steps)
    ema = EMAModel(params, decay=ema_decay) if ema_decay is not None else None
    ckpt_path = run_dir / "ae_checkpoint.pt"
    step, best, wall = 0, -1.0, 0.0
    rng = np.random.default_rng(seed)
    if (ck := load_checkpoint(ckpt_path)) is not None:
        ae.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        sched.load_state_dict(ck["sched"])
        step, best, wall = ck["step"], ck["best"], ck["wall"]
        if ema is not None and ck.get("ema") is not None:  # a run started without one: fresh
            ema.load_state_dict(ck["ema"])
        rng = np.random.default_rng([seed, step])
    frames = _all_frames(data_dirs)
    held = np.asarray(load_shard(heldout_dir)["frames"][:, ::8].reshape(-1, 128, 128, 3))
    if cfg.decoder_only and step == 0:
        best = heldout_psnr(ae, held, device)  # only save what beats the starting weights
        if cfg.init_from is not None:  # out holds the best so far from the start: these
            ae.save_pretrained(out_dir)
            cfg.write(out_dir)
    bar = tqdm(total=steps, initial=step, desc="train-ae", unit="step")
    t0 = time.perf_counter()
    while step < steps:
        if max_minutes is not None and time.perf_counter() - t0 > 60 * max_minutes:
            break
        x = frames_to_tensor(_sample(frames, rng, batch)).to(device)
        with autocast(device):
            if cfg.decoder_only:
                with torch.no_grad():
                    z = ae.encoder(x)
                y = ae.decoder(z).float()
            else:
                y = ae.decoder(ae.encoder(x)).float()
        err = ((y - x) ** 2).mean()
        if loss == "l1+mse":
            err = err + (y - x).abs().mean()
        opt.zero_grad(set_to_none=True)
        err.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        if ema is not None:
            ema.step(params)
        step += 1
        bar.update(1)
        bar.set_postfix(loss=f"{err.item():.4f}")
        timeout = max_minutes is not None and time.perf_counter() - t0 > 60 * max_minutes
        if step % cfg.eval_every == 0 or step == steps or timeout:
            if ema is not None:  # held out and saved: the EMA weights
                ema.store(params)
                ema.copy_to(params)
            psnr = heldout_psnr(ae, held, device)
            bar.write(f"step {step}: held-out PSNR {psnr:.2f} dB")
            if psnr > best:
                best = psnr
                ae.save_pretrained(out_dir)
                cfg.write(out_dir)
            if ema is not None:
                ema.restore(params)
            save_checkpoint(
                ckpt_path,
                model=ae.state_dict(),
                opt=opt.state_dict(),
                sched=sched.state_dict(),
                ema=ema.state_dict() if ema is not None else None,
                step=step,
                best=best,
                wall=wall + time.perf_counter() - t0,
            )
    bar.close()
    result = {
        "steps": step,
        "heldout_psnr_db": round(best, 2),
        "wall_s": round(wall + time.perf_counter() - t0, 1),
    }
    (run_dir / "ae_result.json").write_text(json.dumps(result))
    return result
