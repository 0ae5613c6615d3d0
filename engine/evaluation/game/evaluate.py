"""``worldstream eval --env ID``: a trained game world against the game, on held-out play.

Each figure comes with its ground-truth twin (the env scored against itself, so the metric is
shown sound) and, for PSNR and the object recall / precision, the copy-last baseline (hold the
last true frame). The object table (``game_objects``) judges the game's moving objects, not
pixels: are they where the game has them in rollouts, and does free play move and spawn as
many as the game does.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import torch

from worldstream.engine.evaluation.game import metrics as gm
from worldstream.engine.evaluation.game import objects as go
from worldstream.engine.evaluation.game.episodes import held_out
from worldstream.engine.models.device import cpu_has_fast_bf16
from worldstream.engine.models.game.world import GameWorld
from worldstream.engine.worlds.game.env import GameEnv
from worldstream.engine.worlds.game.policy import HeldKeyPolicy


@dataclass
class GameEvalConfig:
    episodes: int = 8
    """Held-out episodes for the teacher-forced and rollout figures."""
    length: int = 300
    """Frames per held-out episode."""
    horizons: tuple[int, ...] = (16, 64)
    """Free-rollout horizons (frames)."""
    object_horizons: tuple[int, ...] = (1, 4, 16)
    """Rollout frames the object recall / precision is measured at."""
    effect_states: int = 24
    """States the action effect is measured from."""
    free_play: int = 3000
    """Frames of free play (held keys changing every ~30 frames)."""
    seed: int = 0
    """Held-out set index."""


class _Model:
    """Batched palette-index rollouts of a GameWorld (deterministic, as play is)."""

    def __init__(self, world: GameWorld):
        self.world = world
        self.c = world.context

    def encode(self, frames: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(self.world.palette.encode(frames).astype(np.int64))

    def step(self, context: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        # the numerics the backend plays with: bf16 only where the CPU computes it natively
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16,
                                             enabled=cpu_has_fast_bf16()):
            return self.world.next_frame(context, actions)

    def rollout_indices(self, context: torch.Tensor, actions: torch.Tensor,
                        steps: int) -> np.ndarray:
        """``context`` ``(B, c, H, W)``, ``actions`` ``(B, c - 1 + steps)`` -> palette indices
        ``(B, steps, H, W)``."""
        out = []
        for k in range(steps):
            nxt = self.step(context, actions[:, k:k + self.c])
            out.append(nxt)
            context = torch.cat([context[:, 1:], nxt[:, None]], 1)
        return torch.stack(out, 1).numpy()

    def rollout(self, context: torch.Tensor, actions: torch.Tensor, steps: int) -> np.ndarray:
        """As ``rollout_indices``, as RGB frames ``(B, steps, H, W, 3)`` uint8."""
        return self.world.palette.decode(self.rollout_indices(context, actions, steps))


def _teacher_forced(model: _Model, trajs) -> dict:
    preds, truths, prevs = [], [], []
    c = model.c
    for tr in trajs:
        idx = model.encode(tr.frames)
        acts = torch.from_numpy(tr.actions)
        for s in range(c - 1, len(tr.frames) - 1, 64):
            t = np.arange(s, min(s + 64, len(tr.frames) - 1))
            ctx = torch.stack([idx[i - c + 1:i + 1] for i in t])
            act = torch.stack([acts[i - c + 1:i + 1] for i in t])
            preds.append(model.world.palette.decode(model.step(ctx, act).numpy()))
            truths.append(tr.frames[t + 1])
            prevs.append(tr.frames[t])
    pred, truth, prev = (np.concatenate(x) for x in (preds, truths, prevs))
    return {"teacher_forced_psnr_db": gm.pooled_psnr(pred, truth),
            "gt_teacher_forced_psnr_db": gm.pooled_psnr(truth, truth),
            "copylast_tf_psnr_db": gm.pooled_psnr(prev, truth),
            "changed_psnr_db": gm.changed_psnr(pred, truth, prev),
            "copylast_changed_psnr_db": gm.changed_psnr(prev, truth, prev),
            "gt_changed_psnr_db": gm.changed_psnr(truth, truth, prev)}


def _rollouts(model: _Model, trajs, horizons, object_horizons=()) -> dict:
    c, h = model.c, max((*horizons, *object_horizons))
    ctx, acts, truth, last, index = [], [], [], [], []
    for tr in trajs:
        idx = model.encode(tr.frames)
        for s in range(c - 1, len(tr.frames) - h, 40):
            ctx.append(idx[s - c + 1:s + 1])
            acts.append(torch.from_numpy(tr.actions[s - c + 1:s + h]))
            truth.append(tr.frames[s + 1:s + h + 1])
            last.append(tr.frames[s])
            # the frame before the last (copy-last's own objects), the last, the truth
            index.append(idx[[max(s - 1, 0), *range(s, s + h + 1)]].numpy())
    if not ctx:
        return {}
    pred_index = model.rollout_indices(torch.stack(ctx), torch.stack(acts), h)
    pred = model.world.palette.decode(pred_index)
    truth_a, last_a = np.stack(truth), np.stack(last)
    out = {"rollout_starts": len(ctx)}
    if object_horizons:
        index_a = np.stack(index)
        out |= go.rollout_table(index_a[:, 0], index_a[:, 1], index_a[:, 2:], pred_index,
                                object_horizons)
    for k in horizons:
        out[f"rollout_psnr_db_{k}"] = gm.pooled_psnr(pred[:, k - 1], truth_a[:, k - 1])
        out[f"copylast_psnr_db_{k}"] = gm.pooled_psnr(last_a, truth_a[:, k - 1])
        out[f"gt_rollout_psnr_db_{k}"] = gm.pooled_psnr(truth_a[:, k - 1], truth_a[:, k - 1])
    return out


def _action_effect(model: _Model, game: GameEnv, cfg: GameEvalConfig) -> dict:
    """model(a) - model(b) against env(a) - env(b), the action held for 1 and 4 frames."""
    c, n = model.c, game.num_actions
    m1, m4, e1, e4, r1, r4 = ([] for _ in range(6))
    for i in range(cfg.effect_states):
        tr = held_out(game, 100 + i, c + 1, seed=cfg.seed, snapshot_every=1)
        if len(tr.frames) < c + 1:
            continue
        snap = tr.snapshots[c - 1]
        env_frames, twin = [], []
        for a in range(n):
            # the twin plays the same from the same snapshot: the metric's ground truth
            for out in (env_frames, twin):
                game.restore(snap)
                out.append(np.stack([game.step(a) for _ in range(4)]))
        ctx = model.encode(tr.frames[:c])[None].repeat(n, 1, 1, 1)
        head = torch.from_numpy(tr.actions[:c - 1])[None].repeat(n, 1)
        held = torch.arange(n)[:, None].repeat(1, 4)
        pred = model.rollout(ctx, torch.cat([head, held], 1), 4)
        for a, b in itertools.combinations(range(n), 2):
            m1 += [pred[a, 0], pred[b, 0]]
            m4 += [pred[a, 3], pred[b, 3]]
            e1 += [env_frames[a][0], env_frames[b][0]]
            e4 += [env_frames[a][3], env_frames[b][3]]
            r1 += [twin[a][0], twin[b][0]]
            r4 += [twin[a][3], twin[b][3]]
    if not m1:
        return {}

    def corr(xs, ys):
        x, y = np.stack(xs), np.stack(ys)
        return gm.effect_correlation(x[0::2], x[1::2], y[0::2], y[1::2])

    return {"action_effect_corr": corr(m1, e1), "action_effect_corr_4": corr(m4, e4),
            "gt_action_effect_corr": corr(r1, e1), "gt_action_effect_corr_4": corr(r4, e4)}


def _free_play(model: _Model, game: GameEnv, cfg: GameEvalConfig, trajs):
    """Model and env under the same held keys (changing every 20-40 frames) from one
    held-out start; the env resets where its episode ends, the model plays on. The game's
    moving objects and births leave out the transitions into a reset (not play: the whole
    screen changes); the change rate counts every transition."""
    c = model.c
    rng = np.random.default_rng([cfg.seed, 99])
    policy = HeldKeyPolicy(game.action_meanings, rng, min_hold=20, max_hold=40)
    start = held_out(game, 200, c, seed=cfg.seed)
    env = [*start.frames]
    actions = [*start.actions.tolist()]
    resets = []  # frames the env was reset to: no transition of play leads there
    for _ in range(cfg.free_play):
        actions.append(policy())
        env.append(game.step(actions[-1]))
        if game.done:
            env[-1] = game.reset(int(rng.integers(0, 1 << 30)))
            resets.append(len(env) - 1)
    acts = torch.tensor(actions, dtype=torch.int64)[None]
    palette = model.world.palette
    played = model.rollout_indices(model.encode(start.frames[:c])[None], acts,
                                   cfg.free_play)[0]
    model_frames = np.concatenate([start.frames, palette.decode(played)])
    model_index = np.concatenate([palette.encode(start.frames), played])
    env_frames = np.stack(env)
    colours = np.unique(np.concatenate(
        [model.world.palette.colours, env_frames.reshape(-1, 3),
         *(t.frames.reshape(-1, 3) for t in trajs)]), axis=0)
    env_rate = gm.change_rate(env_frames)
    judged = np.ones(len(env_frames) - 1, bool)
    judged[np.asarray(resets, np.int64) - 1] = False
    mine = go.play_figures(model_index)
    theirs = go.play_figures(palette.encode(env_frames), judged)
    out = {"off_palette_share": gm.off_palette_share(model_frames, colours),
           "gt_off_palette_share": gm.off_palette_share(env_frames, colours),
           "change_rate": gm.change_rate(model_frames), "gt_change_rate": env_rate,
           "change_rate_ratio": gm.change_rate(model_frames) / max(env_rate, 1e-9),
           "gt_change_rate_ratio": env_rate / max(env_rate, 1e-9)}
    for key, ratio in (("objects_per_frame", "objects_ratio"),
                       ("births_per_100", "births_ratio")):
        out |= {key: mine[key], f"gt_{key}": theirs[key],
                ratio: _ratio(mine[key], theirs[key]),
                f"gt_{ratio}": _ratio(theirs[key], theirs[key])}
    return out, (model_frames, env_frames)


def _ratio(value: float, game: float) -> float:
    """``value / game``; ``nan`` where the game has none to compare with."""
    return value / game if game > 0 else float("nan")


def evaluate(world: GameWorld, cfg: GameEvalConfig | None = None
             ) -> tuple[dict, tuple[np.ndarray, np.ndarray]]:
    """The metrics dict and the free-play frames ``(model, env)`` for the sheet."""
    cfg = cfg or GameEvalConfig()
    game = GameEnv(world.env_id, size=world.size)
    model = _Model(world)
    trajs = [held_out(game, i, cfg.length, seed=cfg.seed) for i in range(cfg.episodes)]
    result = {"env": world.env_id, "held_out_episodes": cfg.episodes}
    result |= _teacher_forced(model, trajs)
    result |= _rollouts(model, trajs, cfg.horizons, cfg.object_horizons)
    result |= _action_effect(model, game, cfg)
    play, frames = _free_play(model, game, cfg, trajs)
    result |= play
    game.close()
    # JSON has no NaN: a figure without data (no effect to correlate) is null
    return {k: (None if v != v else round(v, 4)) if isinstance(v, float) else v
            for k, v in result.items()}, frames
