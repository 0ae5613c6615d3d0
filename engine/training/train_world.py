"""Train the built-in world model (``worldstream train-world``): one loop for every recipe.

Each step draws ``batch`` clips: ``round(p_onpolicy * batch)`` rows from a pool of the model's
own rollouts (``engine.training.onpolicy``; 0 in the from-scratch recipes) and the rest from the
recorded data (``engine.training.recipe``), the two losses weighted by their row counts. AdamW
with warmup, an EMA of the weights (diffusers ``EMAModel``), the camera dynamics fitted first
on the recorded camera paths and then frozen; checkpoints every ``ckpt_every`` steps for resume;
the EMA weights exported with ``save_pretrained``, beside them the run's ``train_config.json``.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from diffusers.optimization import get_constant_schedule_with_warmup
from diffusers.training_utils import EMAModel
from tqdm import tqdm

from worldstream.engine.models.builtin.attention import (
    DenseContext,
    block_causal_frame_mask,
    expand_frame_mask,
)
from worldstream.engine.models.builtin.camera_dynamics import CameraDynamics
from worldstream.engine.models.builtin.world_dit import WorldDiT
from worldstream.engine.training.common import (
    load_checkpoint,
    pick_device,
    save_checkpoint,
    seed_everything,
)
from worldstream.engine.training.config import TrainConfig
from worldstream.engine.training.latents import LatentDataset, attach_poses
from worldstream.engine.training.recipe import recipe_clips, world_loss
from worldstream.engine.training.warm_start import warm_start
from worldstream.engine.worlds.catalog import make_base_warp, world


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


class _PoolKeeper:
    """The on-policy rollout pool of a run: built by the current EMA weights for each round of
    ``refresh_every`` steps (one round when 0), saved in ``run_dir/onpolicy_pool.pt`` so that
    a resumed run reads it back, each build logged."""

    def __init__(self, cfg: TrainConfig, model: WorldDiT, ema: EMAModel, ae, shard_dirs,
                 settings, data: LatentDataset, run_dir: Path, log, device: torch.device):
        self.cfg, self.model, self.ema, self.ae = cfg, model, ema, ae
        self.shard_dirs, self.settings, self.data = list(shard_dirs), settings, data
        self.path, self.log, self.device = run_dir / "onpolicy_pool.pt", log, device

    def round_of(self, step: int) -> int:
        return step // self.cfg.refresh_every if self.cfg.refresh_every else 0

    def current(self, step: int):
        """The pool of ``step``'s round: the saved one when it is that round's, else new."""
        from worldstream.engine.training.onpolicy import OnPolicyPool, build_pool

        rnd = self.round_of(step)
        if self.path.exists() and (saved := OnPolicyPool(**torch.load(self.path))).round == rnd:
            return saved
        cfg, n = self.cfg, self.data.latents.shape[0]
        pick = np.random.default_rng([cfg.seed, rnd, 29]).choice(
            n, size=min(cfg.pool_episodes, n), replace=False)
        ema_model = copy.deepcopy(self.model)
        self.ema.copy_to([p for p in ema_model.parameters() if p.requires_grad])
        t = time.perf_counter()
        pool = build_pool(ema_model.eval(), self.ae, self.shard_dirs, np.sort(pick), round=rnd,
                          batch=cfg.rollout_batch, steps=cfg.rollout_steps, device=self.device,
                          prompts=world(cfg.world).prompts, settings=self.settings)
        torch.save(pool.__dict__, self.path)
        rec = {"event": "pool", "round": rnd, "step": step, "episodes": len(pick),
               "camera_rms_px": round(pool.camera_rms, 3), "s": round(time.perf_counter() - t, 1)}
        self.log.write(json.dumps(rec) + "\n")
        self.log.flush()
        tqdm.write(json.dumps(rec))
        return pool


def model_inputs(cfg: TrainConfig) -> tuple[str | None, str | None]:
    """``(skip_source, pose_path)`` of the model a run trains: an on-policy fine-tune keeps
    its ``init_from`` model's, any other run takes ``cfg``'s (what the data must carry)."""
    if cfg.p_onpolicy > 0:
        saved = WorldDiT.load_config(cfg.init_from)
        return saved.get("skip_source"), saved.get("pose_path")
    return cfg.skip_source, cfg.pose_path


def build_model(cfg: TrainConfig, data: LatentDataset, fresh: bool,
                device: torch.device) -> WorldDiT:
    """The model of a run: an on-policy fine-tune's ``init_from`` as saved; else a new
    :class:`WorldDiT` of ``cfg``'s shape with ``data``'s latent statistics, warm-started from
    ``init_from`` or (fresh, no ``init_from``) with its camera dynamics fitted."""
    if cfg.p_onpolicy > 0:
        return WorldDiT.from_pretrained(cfg.init_from).to(device)
    spec = world(cfg.world)
    mean, std = latent_stats(data)
    latent_size = data.latents.shape[-1]
    model = WorldDiT(
        latent_channels=data.latents.shape[2], latent_size=latent_size,
        patch_size=latent_size // 8,  # 8 x 8 tokens per frame
        dim=cfg.dim, depth=cfg.depth, num_heads=cfg.num_heads, chunk_frames=cfg.chunk_frames,
        latent_mean=tuple(mean), latent_std=tuple(std), view_box=spec.view_box,
        num_actions=spec.num_actions, action_factors=spec.action_factors,
        skip_source=cfg.skip_source, pose_path=cfg.pose_path, skip_prior=cfg.skip_prior,
    ).to(device)
    if cfg.init_from is not None and fresh:
        warm_start(model, WorldDiT.from_pretrained(cfg.init_from).state_dict())
    elif fresh:
        rms = fit_camera_dynamics(model.camera, data.camera, data.actions, cfg.camera_steps)
        tqdm.write(f"camera dynamics fitted: RMS position error {rms:.2f} px")
    return model


def train_world(
    cfg: TrainConfig,
    data: LatentDataset,
    out_dir: Path,
    run_dir: Path,
    *,
    max_minutes: float | None = None,
    ae=None,
    shard_dirs: Sequence[Path] = (),
    settings: dict | None = None,
) -> dict:
    """Train or resume the run in ``run_dir`` up to ``cfg.steps`` steps (or ``max_minutes`` of
    wall time this call); EMA weights and ``train_config.json`` exported to ``out_dir``.

    ``data``: the encoded shards (with ``data.skip`` for a ``"warped"`` skip source). On-policy
    rows (``cfg.p_onpolicy > 0``) also need the autoencoder ``ae``, the recorded
    ``shard_dirs`` the rollouts replay and the world's streaming ``settings``
    (``BuiltinConfig`` keyword arguments). Returns ``{"steps", "final_loss", "wall_s"}`` (plus
    ``pool_round`` and ``camera_rms_px`` with on-policy rows), also written to
    ``run_dir/<kind>_result.json``."""
    onpolicy = cfg.p_onpolicy > 0
    if onpolicy and (ae is None or not shard_dirs):
        raise ValueError("on-policy rows (p_onpolicy > 0) need the autoencoder and the shards")
    # NOTE: file names and seed salts of the two kinds of run kept as the shipped runs had them
    kind, salt = ("onpolicy", 17) if onpolicy else ("world", 0)
    device = pick_device()
    seed_everything(cfg.seed)
    ckpt_path = run_dir / f"{kind}_checkpoint.pt"
    model = build_model(cfg, data, not ckpt_path.exists(), device)
    mc = model.config
    if mc.pose_path is not None:
        attach_poses(data, make_base_warp(mc.pose_path, mc.image_size))
    params, ema, opt, sched, step, wall = resume_run(model, cfg.lr, cfg.warmup, ckpt_path, device)
    rng = np.random.default_rng([cfg.seed, step, salt] if salt else [cfg.seed, step])
    gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step + salt)
    ctx = DenseContext(expand_frame_mask(block_causal_frame_mask(cfg.frames, mc.chunk_frames),
                                         model.tokens_per_frame).to(device))
    run_dir.mkdir(parents=True, exist_ok=True)
    log = (run_dir / f"{kind}_log.jsonl").open("a")
    pools = _PoolKeeper(cfg, model, ema, ae, shard_dirs, settings, data, run_dir, log, device)
    pool = pools.current(step) if onpolicy else None
    t0 = time.perf_counter()

    def checkpoint() -> None:
        save_run(ckpt_path, model, ema, opt, sched, step, wall + time.perf_counter() - t0)

    def export() -> None:
        export_ema(model, ema, params, out_dir)
        cfg.write(out_dir)

    n_own = int(round(cfg.p_onpolicy * cfg.batch))
    losses: list[tuple[float, float, float]] = []  # (recipe rows, own rows, step)
    bar = tqdm(total=cfg.steps, initial=step, desc=f"train-world {cfg.world}", unit="step")
    while step < cfg.steps:
        if max_minutes is not None and time.perf_counter() - t0 > 60 * max_minutes:
            break
        if onpolicy and pools.round_of(step) != pool.round:
            checkpoint()
            pool = pools.current(step)
        model.train()
        total, parts = 0.0, [float("nan"), float("nan")]
        if cfg.batch - n_own > 0:
            lat, base, known, actions, txt, skip, pose = recipe_clips(
                data, rng, cfg.batch - n_own, cfg.frames, mc.chunk_frames, mc.skip_source)
            lo = world_loss(model, lat, base, known, actions, txt, gen, mc.chunk_frames,
                            cfg.ctx_sigma_max, ctx, device, cfg.p_context,
                            change_weight=cfg.change_weight, skip=skip, pose=pose)
            total = total + lo * (cfg.batch - n_own) / cfg.batch
            parts[0] = lo.item()
        if n_own > 0:
            from worldstream.engine.training.onpolicy import onpolicy_loss

            *clips, skip, pose = pool.sample(data, rng, n_own, cfg.frames, mc.skip_source)
            lo = onpolicy_loss(model, *clips, gen, mc.chunk_frames, cfg.ctx_sigma_max, ctx,
                               device, change_weight=cfg.change_weight, skip=skip, pose=pose)
            total = total + lo * n_own / cfg.batch
            parts[1] = lo.item()
        opt.zero_grad(set_to_none=True)
        total.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        ema.step(params)
        step += 1
        losses.append((parts[0], parts[1], total.item()))
        bar.update(1)
        bar.set_postfix(loss=f"{np.mean([row[2] for row in losses[-50:]]):.4f}")
        if step % cfg.ckpt_every == 0:
            checkpoint()
            recent = np.array(losses[-cfg.ckpt_every:])
            rec = {"event": "step", "step": step, "loss_recipe": _mean(recent[:, 0]),
                   "loss_own": _mean(recent[:, 1]),
                   "wall_s": round(wall + time.perf_counter() - t0, 1)}
            log.write(json.dumps(rec) + "\n")
            log.flush()
        if step % cfg.export_every == 0:
            export()
    bar.close()
    checkpoint()
    export()
    log.close()
    result = {
        "steps": step,
        "final_loss": float(np.mean([row[2] for row in losses[-100:]])) if losses else None,
        "wall_s": round(wall + time.perf_counter() - t0, 1),
    }
    if onpolicy:
        result.update(pool_round=pool.round, camera_rms_px=round(pool.camera_rms, 3))
    (run_dir / f"{kind}_result.json").write_text(json.dumps(result))
    return result


def _mean(values: np.ndarray) -> float | None:
    """Mean of the non-NaN ``values`` (5 decimals), None when there are none."""
    values = values[~np.isnan(values)]
    return round(float(values.mean()), 5) if values.size else None
