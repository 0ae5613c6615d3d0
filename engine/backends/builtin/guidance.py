"""The built-in family's ``denoise`` stage: flow matching with classifier-free guidance on the
prompt and on the action, and the memory base standing in for the first step.

Guidance: ``u + s·(c - u)`` from the denoiser's predictions without and with the condition
(Ho & Salimans 2022); on the prompt in the chunks after a switch and at the high-noise steps
of every chunk (``steady_guidance_sigma``: guidance in a limited interval, Kynkäänniemi et al.
2024), on the action against the world's neutral action; two terms are summed (composable
diffusion, Liu et al. 2022). The negative forwards run beside the conditional one
(``paged_context.batched_forwards``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from worldstream.engine.backends.builtin.state import ChunkRecord
from worldstream.engine.backends.paged_context import batched_forwards
from worldstream.engine.backends.sampler import denoise as flow_denoise
from worldstream.engine.backends.stages import ChunkBatch, keep_latents

if TYPE_CHECKING:
    from worldstream.engine.backends.builtin.protocol import BuiltinRunner


def denoise(backend: BuiltinRunner, batch: ChunkBatch) -> None:
    """Stage: the batch's clean latents ``(B, F, C, h, w)`` float32, into its records."""
    cond, ctx = batch.cond, batch.attention

    def predict_x0(x, sigma):
        return backend.to_x0(x, sigma, guided_forward(backend, x, sigma, cond, ctx))

    batch.x0 = flow_denoise(predict_x0, batch.noise, batch.steps, backend.config.shift,
                            first_x0=first_x0(backend, batch.records, cond, batch.steps))
    keep_latents(backend, batch)


def guided_forward(backend: BuiltinRunner, x: torch.Tensor, sigma: float, cond: tuple,
                   ctx: Any) -> torch.Tensor:
    """One denoising step's prediction for chunks ``x`` at ``sigma``: guided on the prompt
    for guided rows (all rows at σ >= ``steady_guidance_sigma``) and on the action for rows
    asking a non-neutral one."""
    base, base_sigma, known, actions, txt, pos, guided, skip, pose = cond
    cfg = backend.config
    if cfg.steady_guidance_sigma is not None and sigma >= cfg.steady_guidance_sigma - 1e-6:
        guided = torch.ones_like(guided)
    terms = []  # (per-row scale - 1, negative condition)
    if cfg.guidance != 1 and bool(guided.any()):
        terms.append((torch.where(guided, cfg.guidance - 1.0, 0.0),
                      (base, base_sigma, known, actions, torch.zeros_like(txt), pos, guided,
                       skip, pose)))
    if cfg.action_guidance != 1:
        neutral = neutral_actions(backend, actions)
        asked = (actions != neutral).any(dim=1)
        if bool(asked.any()):
            terms.append((torch.where(asked, cfg.action_guidance - 1.0, 0.0),
                          (base, base_sigma, known, neutral, txt, pos, guided, skip, pose)))
    *negatives, out = batched_forwards(backend.forward, x, sigma,
                                       [neg for _, neg in terms] + [cond], ctx,
                                       backend.scratch_pages, cfg.batched_guidance)
    guided_out = out
    for (scale, _), negative in zip(terms, negatives):
        scale = scale.to(out.dtype).view(-1, *([1] * (out.dim() - 1)))
        guided_out = guided_out + scale * (out - negative)
    return guided_out


def neutral_actions(backend: BuiltinRunner, actions: torch.Tensor) -> torch.Tensor:
    """The negative condition of action guidance for int64 ids ``actions (B, F)``: the
    neutral action, with the ``kept_factors`` of each id as asked (factored ids
    ``a_0 + f_0 * (a_1 + f_1 * ...)``, as ``WorldDiTActionEmbedding`` reads them)."""
    cfg = backend.config
    neutral = torch.full_like(actions, cfg.neutral_action)
    if not cfg.kept_factors:
        return neutral
    out = torch.zeros_like(actions)
    asked, rest, scale = actions, neutral, 1
    for i, size in enumerate(backend.model.config.action_factors):
        digit = asked % size if i in cfg.kept_factors else rest % size
        out = out + scale * digit
        asked, rest, scale = asked // size, rest // size, scale * size
    return out


def first_step_skipped(config: Any, steps: int) -> bool:
    """Whether chunks of ``steps`` steps take their first prediction from memory."""
    least = config.first_step_from_memory
    return least is not None and steps >= least


def first_x0(backend: BuiltinRunner, records: list[ChunkRecord], cond: tuple,
             steps: int) -> torch.Tensor | None:
    """The chunks' memory bases ``(B, F, C, h, w)`` (with their context noise, as the model
    reads them) as the first step's prediction (SDEdit's start from a noised guide), in
    chunks of at least ``first_step_from_memory`` steps outside a prompt switch's guided
    chunks whose views hold nothing stale; else None (one such chunk runs its whole batch on
    the full schedule: the batch shares its steps)."""
    if not first_step_skipped(backend.config, steps) or any(
            r.guided or bool(r.known[:, 1].any()) for r in records):
        return None
    return cond[0]
