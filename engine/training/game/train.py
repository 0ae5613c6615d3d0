"""``worldstream train --env ID``: one recipe for every game.

Records play when no dataset is given, fits the palette, then trains ``GameUNet`` on
cross-entropy over palette colours with changed pixels weighted (``change_weight``; undone at
decoding) and pixels already right past ``loss_cutoff`` left out (SimPLe's cutoff: the few
pixels of a ball are not drowned by thousands of settled ones), and a discrete outcome code
per frame drawn from a posterior that sees the true next frame (straight-through), dropped in
``code_drop`` of the frames and replaced by the prior's own draw in ``code_mix`` (SimPLe),
while the code's categorical prior learns to predict it from the past (the balanced KL of
DreamerV2's discrete latents, with free nats); partly on its own predictions: each step
predicts ``unroll`` frames in a row, each from the context that holds the previous predictions
(argmax, no gradient through it), so the model learns to continue from its own frames
(DIAMOND, Self-Forcing). Resumable (checkpoint every ``checkpoint_every`` steps), EMA weights,
tqdm.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import shutil
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from worldstream.engine.models.game.palette import Palette
from worldstream.engine.models.game.unet import GameUNet, drop_retired
from worldstream.engine.models.game.world import GameWorld
from worldstream.engine.training.common import (
    autocast,
    cpu_threads,
    load_checkpoint,
    save_checkpoint,
    seed_everything,
)
from worldstream.engine.training.game.data import ClipSampler
from worldstream.engine.worlds.game import dataset, keymap
from worldstream.engine.worlds.game.record import record


@dataclass
class GameTrainConfig:
    env: str = ""
    """Gymnasium env id or module:factory of the game."""
    out: str = ""
    """Output folder: the trained world (and checkpoint.pt while training)."""
    data: str = ""
    """A recording (``worldstream record``); empty: record ``record_frames`` into OUT/data."""
    record_frames: int = 60_000
    """Frames recorded when no dataset is given."""
    size: int = 64
    """Frame size (pixels, square)."""
    steps: int = 1_400
    """Optimiser steps (the default: about an hour on two CPU cores with fast bf16, under one
    pass over 60,000 recorded frames; the shipped worlds' learning curves, in their cards,
    show what more steps buy)."""
    batch: int = 32
    """Clips per step."""
    context: int = 4
    """Context frames the model sees."""
    unroll: int = 2
    """Frames predicted in a row per clip, each after the previous predictions."""
    channels: tuple[int, ...] = (32, 64, 128, 128)
    """U-Net widths per resolution."""
    max_colours: int = 64
    """Palette size cap."""
    change_weight: float = 10.0
    """Loss weight of pixels that differ from the last context frame."""
    code_grid: int = 4
    """Outcome code cells per side (0: none): one token per cell carries what the past
    cannot settle there (a serve, an enemy's step), sampled at play, so the network is not
    pulled towards freezing the frame."""
    code_classes: int = 8
    """Values per code token."""
    code_drop: float = 0.1
    """Share of frames trained without their code (all zeros), so the actions alone still
    decide what they decide."""
    code_mix: float = 0.25
    """Share of frames trained on a code drawn from the prior instead of the posterior's, so
    the network learns to draw what the prior proposes (SimPLe)."""
    loss_cutoff: float = 0.03
    """Pixels whose cross-entropy is below this (nats) cost nothing (SimPLe's cutoff)."""
    latent_dim: int = 0
    """The older continuous latent's width (0: none; exclusive with the code)."""
    kl_weight: float = 1.0
    """Weight of the code's rate (or the latent's KL; nats per frame) against the weighted
    cross-entropy summed over pixels."""
    kl_free: float = 1.0
    """Free nats: a batch's mean rate below this many nats per frame costs nothing, so the
    code is not shut before the network has learnt what it could carry (a rare serve is
    worth a few nats once every few dozen frames)."""
    corrupt: float = 0.05
    """Context corruption: half the clips get up to this share of their context pixels
    replaced by pixels from elsewhere in the same frame, so the model learns to repair what
    its own rollouts erode (without it the paddle wore away in free play)."""
    lr: float = 1e-3
    """AdamW peak learning rate (warmup 100 steps, cosine to 5 %)."""
    ema: float = 0.999
    """EMA decay of the shipped weights."""
    seed: int = 0
    """Seed of the recording, the clips and the initial weights."""
    threads: int = 2
    """CPU threads (0: torch's default)."""
    device: str = "cpu"
    """cpu or cuda."""
    checkpoint_every: int = 200
    """Steps between checkpoints (resume: run the same command again)."""
    curve: tuple[int, ...] = (1_000, 2_000, 5_000, 10_000, 20_000)
    """Steps at which the EMA world is also saved to ``OUT/curve/step-NNNNNN`` (the learning
    curve's points: ``worldstream eval`` judges each)."""
    workers: int = 2
    """Recording processes."""


#: settings that say where and how a run goes, not what it computes: a checkpoint moved to
#: another folder or machine resumes under other values of these
RUN_ONLY = frozenset({"out", "data", "threads", "workers", "device", "checkpoint_every"})


def _lr(step: int, cfg: GameTrainConfig) -> float:
    warm = min(1.0, (step + 1) / 100)
    progress = step / max(cfg.steps, 1)
    return cfg.lr * warm * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * progress)))


def corrupt_context(context: torch.Tensor, rate: float, gen: torch.Generator) -> torch.Tensor:
    """``context`` ``(B, c, H, W)`` long with, in half the clips, a share (uniform up to
    ``rate``) of pixels replaced by a random pixel of the same frame: objects lose pixels
    (mostly to the background) and a few stray pixels appear, as in a model's own rollout."""
    b, c, h, w = context.shape
    share = torch.rand(b, 1, 1, 1, generator=gen) * rate
    share = share * (torch.rand(b, 1, 1, 1, generator=gen) < 0.5)
    mask = torch.rand(b, c, h, w, generator=gen) < share
    source = torch.randint(0, h * w, (b, c, h * w), generator=gen)
    shuffled = context.flatten(2).gather(2, source).view_as(context)
    return torch.where(mask, shuffled, context)


def _code(unet: GameUNet, target: torch.Tensor, context: torch.Tensor, actions: torch.Tensor,
          cfg: GameTrainConfig, gen: torch.Generator
          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The frame's code for the network, ``(B, classes, grid, grid)``: a draw from the
    posterior ``q(code | next frame, last frame)`` (Gumbel-max, straight-through on its
    probabilities; zeros in ``code_drop`` of the rows, a draw from the prior in ``code_mix``);
    the rate ``KL(q || p)`` in nats per frame (summed over cells, batch mean) as the
    posterior's cost (``p`` held fixed) and as the prior's (``q`` held fixed): the balanced KL
    of DreamerV2's discrete latents, so the prior learns what the posterior draws and the
    posterior keeps to what the prior can learn."""
    q = unet.posterior(target, context[:, -1]).float().log_softmax(-1)  # (B, cells, classes)
    gumbel = -torch.log(-torch.log(torch.rand(q.shape, generator=gen).clamp(1e-9, 1 - 1e-9)))
    hard = (q + gumbel.to(q.device)).argmax(-1)
    probs = q.exp()
    code = unet.code_map(F.one_hot(hard, cfg.code_classes).to(probs) + probs - probs.detach())
    prior = unet.code_prior
    logits = prior.logits(context, actions)
    p = logits.log_softmax(-1)
    kl_posterior = (probs * (q - p.detach())).sum((1, 2)).mean()
    kl_prior = (probs.detach() * (q.detach() - p)).sum((1, 2)).mean()
    pick = torch.rand(len(hard), 1, 1, 1, generator=gen).to(code.device)
    with torch.no_grad():
        u = torch.rand(hard.shape, generator=gen).to(code.device)
        drawn = unet.code_onehot(prior.sample(logits.detach(), u)).to(code)
    code = torch.where(pick < cfg.code_drop, torch.zeros_like(code),
                       torch.where(pick < cfg.code_drop + cfg.code_mix, drawn, code))
    return code, kl_posterior, kl_prior


def _clip_loss(unet: GameUNet, frames: torch.Tensor, actions: torch.Tensor,
               cfg: GameTrainConfig, gen: torch.Generator) -> tuple[torch.Tensor, float]:
    """Mean weighted cross-entropy (plus the code prior's cross-entropy, or the continuous
    latent's KL) over the ``unroll`` predicted frames of a clip batch, and the prior's
    cross-entropy (or the KL) in nats per frame: how much the code carries."""
    c = cfg.context
    context = frames[:, :c]
    if cfg.corrupt > 0:
        context = corrupt_context(context, cfg.corrupt, gen)
    total = frames.new_zeros((), dtype=torch.float32)
    kl_nats = 0.0
    for k in range(cfg.unroll):
        target = frames[:, c + k]
        z, kl = None, 0.0
        if cfg.code_grid:
            z, kl, kl_prior = _code(unet, target, context, actions[:, k:k + c], cfg, gen)
            kl_nats += kl.item() / cfg.unroll
            # free nats: a rate below kl_free costs the posterior nothing (as the latent's)
            kl = cfg.kl_weight * len(target) * torch.clamp(kl, min=cfg.kl_free)
        elif cfg.latent_dim:
            mu, logvar = unet.posterior(target, context[:, -1])
            eps = torch.randn(mu.shape, generator=gen).to(mu.device)
            z = mu + eps * (0.5 * logvar).exp()
            kl = 0.5 * (mu.square() + logvar.exp() - 1 - logvar).sum()
            kl_nats += kl.item() / len(mu) / cfg.unroll
            kl = torch.clamp(kl, min=cfg.kl_free * len(mu))
        logits = unet(context, actions[:, k:k + c], z).float()
        weight = 1.0 + (cfg.change_weight - 1.0) * (target != context[:, -1]).float()
        loss = F.cross_entropy(logits, target, reduction="none")
        if cfg.loss_cutoff > 0:
            loss = torch.where(loss < cfg.loss_cutoff, torch.zeros_like(loss), loss)
        if cfg.code_grid:  # the prior's parameters are its own: its nats count as they are
            total = total + ((loss * weight).sum() + kl) / weight.sum() + kl_prior
        else:
            total = total + ((loss * weight).sum() + cfg.kl_weight * kl) / weight.sum()
        with torch.no_grad():
            guess = logits.argmax(1)
        context = torch.cat([context[:, 1:], guess[:, None]], 1)
    return total / cfg.unroll, kl_nats


class Stopped(Exception):
    """Training stopped by a signal (SIGTERM, SIGINT) after writing its checkpoint at
    ``step``: the same command resumes it."""

    def __init__(self, step: int, signum: int, checkpoint: Path):
        super().__init__(f"stopped at step {step} by {signal.Signals(signum).name}; "
                         f"checkpoint {checkpoint} written: the same command resumes")
        self.step, self.signum, self.checkpoint = step, signum, checkpoint


class _StopRequests:
    """SIGTERM and SIGINT, while installed (main thread only), ask the loop to stop after the
    step in flight: a session's end or a Ctrl-C loses no step. The previous handlers come back
    on exit."""

    def __init__(self):
        self.signum: int | None = None
        self._old: dict[int, object] = {}

    def __enter__(self) -> _StopRequests:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._old[sig] = signal.signal(sig, self._ask)
        return self

    def _ask(self, signum, _frame) -> None:
        self.signum = signum

    def __exit__(self, *exc) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


def prepare_data(cfg: GameTrainConfig) -> tuple[dict, dataset.Episodes]:
    """The training recording: ``cfg.data``, or one recorded into ``OUT/data`` (reused when
    a resumed run finds it)."""
    folder = Path(cfg.data) if cfg.data else Path(cfg.out) / "data"
    if not cfg.data and not (folder / "meta.json").exists():
        shutil.rmtree(folder, ignore_errors=True)
        record(cfg.env, folder, cfg.record_frames, size=cfg.size, seed=cfg.seed,
               workers=cfg.workers)
    meta, episodes = dataset.load(folder, env_id=cfg.env)
    if int(meta["size"]) != cfg.size:
        raise ValueError(f"{folder} holds {meta['size']}-pixel frames, not {cfg.size}")
    return meta, episodes


def train(cfg: GameTrainConfig, progress: bool = True) -> GameWorld:
    """Train (or resume) the world of ``cfg.env`` into ``cfg.out``; the EMA world."""
    if not cfg.env or not cfg.out:
        raise ValueError("train needs an env id and an output folder")
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    seed_everything(cfg.seed)
    meta, episodes = prepare_data(cfg)
    meanings = tuple(meta["action_meanings"])
    palette = Palette.fit(episodes.frames[:: max(1, len(episodes) // 5000)], cfg.max_colours)
    sampler = ClipSampler(episodes, palette, cfg.context + cfg.unroll,
                          np.random.default_rng(cfg.seed))
    device = torch.device(cfg.device)
    unet = GameUNet(num_colours=len(palette), num_actions=len(meanings), context=cfg.context,
                    channels=tuple(cfg.channels), size=cfg.size, latent_dim=cfg.latent_dim,
                    code_grid=cfg.code_grid, code_classes=cfg.code_classes).to(device)
    ema = GameUNet.from_config(unet.config).to(device)
    ema.load_state_dict(unet.state_dict())
    opt = torch.optim.AdamW(unet.parameters(), lr=cfg.lr, weight_decay=0.01)
    gen = torch.Generator().manual_seed(cfg.seed)  # the corruption's draws (resumed exactly)
    ckpt_path = out / "checkpoint.pt"
    start, log, elapsed = 0, [], 0.0
    kls: list[float] = []
    state = load_checkpoint(ckpt_path)
    if state is not None:
        try:  # a retired setting at today's value is today's recipe
            recorded = drop_retired(state["config"])
        except ValueError as err:
            raise ValueError(f"{ckpt_path}: {err}") from None
        now = dataclasses.asdict(cfg)
        differ = sorted(k for k in set(recorded) | set(now)
                        if k not in RUN_ONLY and recorded.get(k) != now.get(k))
        if differ:
            raise ValueError(f"{ckpt_path} was written by another recipe (it differs in "
                             f"{', '.join(differ[:4])}); use another --out "
                             "or delete it")
        unet.load_state_dict(state["unet"])
        ema.load_state_dict(state["ema"])
        opt.load_state_dict(state["opt"])
        palette = Palette(state["palette"])
        sampler.rng.bit_generator.state = state["rng"]
        gen.set_state(state["torch_rng"])
        start, log, elapsed = state["step"], state["log"], state["elapsed"]
        kls = state.get("code_log", [])
    def checkpoint(step: int) -> None:
        save_checkpoint(ckpt_path, unet=unet.state_dict(), ema=ema.state_dict(),
                        opt=opt.state_dict(), palette=palette.colours, step=step,
                        rng=sampler.rng.bit_generator.state, log=log, code_log=kls,
                        torch_rng=gen.get_state(), elapsed=elapsed + time.perf_counter() - t0,
                        config=dataclasses.asdict(cfg))

    with cpu_threads(cfg.threads if device.type == "cpu" else None), _StopRequests() as stop:
        bar = tqdm(range(start, cfg.steps), initial=start, total=cfg.steps, disable=not progress,
                   desc=f"train {cfg.env}")
        t0 = time.perf_counter()
        for step in bar:
            for group in opt.param_groups:
                group["lr"] = _lr(step, cfg)
            frames, actions = sampler.sample(cfg.batch)
            with autocast(device):
                loss, kl = _clip_loss(unet, frames.to(device), actions.to(device), cfg, gen)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            # the prior apart: its nats per frame must not shrink the frame network's steps
            prior = list(unet.code_prior.parameters()) if unet.code_prior is not None else []
            mine = {id(p) for p in prior}
            torch.nn.utils.clip_grad_norm_([p for p in unet.parameters() if id(p) not in mine],
                                           1.0)
            if prior:
                torch.nn.utils.clip_grad_norm_(prior, 1.0)
            opt.step()
            # EMA with warm-up: a short run's average is not dominated by the initial weights
            decay = min(cfg.ema, (1 + step) / (10 + step))
            with torch.no_grad():
                for pe, p in zip(ema.parameters(), unet.parameters(), strict=True):
                    pe.lerp_(p, 1 - decay)
            log.append(loss.item())
            kls.append(kl)
            bar.set_postfix(loss=f"{np.mean(log[-50:]):.4f}",
                            code=f"{np.mean(kls[-50:]):.2f}")
            if step + 1 in cfg.curve and step + 1 < cfg.steps:
                snap = out / "curve" / f"step-{step + 1:06d}"
                _save_world(copy.deepcopy(ema).cpu().eval(), palette, cfg, meanings, snap)
                _write_record(snap, cfg, elapsed + time.perf_counter() - t0, meta,
                              len(episodes), len(sampler), len(palette), log, kls,
                              f"the EMA weights at step {step + 1:,} of this {cfg.steps:,}-step "
                              "run (a learning-curve snapshot)", step + 1)
            if (step + 1) % cfg.checkpoint_every == 0 or step + 1 == cfg.steps \
                    or stop.signum is not None:
                checkpoint(step + 1)
            if stop.signum is not None and step + 1 < cfg.steps:
                bar.close()
                raise Stopped(step + 1, stop.signum, ckpt_path)
        elapsed += time.perf_counter() - t0
    world = _save_world(ema.cpu().eval(), palette, cfg, meanings, out)
    _write_record(out, cfg, elapsed, meta, len(episodes), len(sampler), len(palette), log, kls)
    return world


def _write_record(folder: Path, cfg: GameTrainConfig, seconds: float, meta: dict, frames: int,
                  clips: int, colours: int, log: list[float], kls: list[float],
                  weights: str | None = None, step: int | None = None) -> None:
    """``folder/training.json``: the run's settings, data and loss curve (what the card and
    its rebuild chain read); ``weights`` says which weights the folder holds where they are
    not the run's last (a learning-curve snapshot, of ``step`` steps)."""
    record = {
        "config": dataclasses.asdict(cfg), "step": step or cfg.steps,
        "train_seconds": round(seconds, 1),
        "frames": frames, "clips": clips, "colours": colours,
        "policy": meta.get("policy", "held-key"),
        "loss_first_50": float(np.mean(log[:50])) if log else None,
        "loss_last_50": float(np.mean(log[-50:])) if log else None,
        "code_nats_last_50": float(np.mean(kls[-50:])) if kls else None,
        "loss_per_100": [round(float(np.mean(log[i:i + 100])), 5)
                         for i in range(0, len(log), 100)],
        "code_nats_per_100": [round(float(np.mean(kls[i:i + 100])), 4)
                              for i in range(0, len(kls), 100)]}
    if weights:
        record["weights"] = weights
    (folder / "training.json").write_text(json.dumps(record, indent=1) + "\n")


def _save_world(unet: GameUNet, palette: Palette, cfg: GameTrainConfig,
                meanings: tuple[str, ...], folder: Path) -> GameWorld:
    """The world of ``unet`` written to ``folder`` with its key map (kept where a user
    edited it)."""
    world = GameWorld(unet, palette, cfg.env, cfg.size, meanings, cfg.change_weight)
    folder.mkdir(parents=True, exist_ok=True)
    world.save(folder)
    if not (folder / "keymap.json").exists():  # the page's keys, editable; kept when edited
        (keymap.shipped(cfg.env, meanings) or keymap.derive(cfg.env, meanings)).save(
            folder / "keymap.json")
    return world
