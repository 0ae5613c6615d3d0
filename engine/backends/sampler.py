"""Few-step flow-matching denoising of a batch of chunks (the runner does the cache fill).

Flow matching (Rectified Flow / SD3): ``x_σ = (1 - σ)·x0 + σ·ε``; the model predicts x0, which is
turned into the velocity ``v = (x_σ - x0) / σ`` that diffusers' ``FlowMatchEulerDiscreteScheduler``
integrates. Steps use the base levels ``1, (n-1)/n, ..., 1/n`` mapped by the scheduler's shift
(passed as explicit ``sigmas``: ``set_timesteps(n)`` with a shift wastes the last step); the
last Euler step lands exactly on the model's x0.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from diffusers import FlowMatchEulerDiscreteScheduler

from worldstream.engine.core.limits import MAX_STEPS


def step_sigmas(steps: int, shift: float) -> list[float]:
    """The noise levels visited by ``steps`` denoising steps (before the final 0).

    >>> [round(s, 3) for s in step_sigmas(4, 2.0)]
    [1.0, 0.857, 0.667, 0.4]
    """
    if not 1 <= steps <= MAX_STEPS:
        raise ValueError(f"steps must be in [1, {MAX_STEPS}], got {steps}")
    scheduler = FlowMatchEulerDiscreteScheduler(shift=shift)
    scheduler.set_timesteps(sigmas=[1.0 - i / steps for i in range(steps)])
    return scheduler.sigmas[:-1].tolist()


@torch.no_grad()
def denoise(
    predict_x0: Callable[[torch.Tensor, float], torch.Tensor],
    noise: torch.Tensor,
    steps: int,
    shift: float = 2.0,
    first_x0: torch.Tensor | None = None,
) -> torch.Tensor:
    """Integrate from pure noise to a clean sample.

    Args:
        predict_x0: ``(x_σ, σ) -> x0`` with tensors shaped like ``noise``.
        noise: standard normal noise (σ = 1) of any shape, e.g. ``(B, F, C, h, w)`` for the
            built-in model, ``(B, C, F, h, w)`` for Wan; any float dtype.
        steps: 1-4 Euler steps.
        shift: timestep shift of the scheduler (larger = more time at high noise).
        first_x0: a guess of the first step's prediction (at σ = 1), shaped like ``noise``:
            used instead of calling ``predict_x0`` there, so ``steps`` levels cost
            ``steps - 1`` predictions and the second level starts at
            ``(1 - σ_2)·first_x0 + σ_2·noise`` — SDEdit's start from a noised guide
            (Meng et al., "SDEdit", ICLR 2022). None: every step predicts.
    Returns:
        float32 clean latents shaped like ``noise``. ValueError for ``steps`` outside 1-4, or
        for ``first_x0`` with one step (the sample would be the guess, unchanged).
    """
    if not 1 <= steps <= MAX_STEPS:
        raise ValueError(f"steps must be in [1, {MAX_STEPS}], got {steps}")
    if first_x0 is not None and steps < 2:
        raise ValueError("first_x0 needs at least 2 steps")
    scheduler = FlowMatchEulerDiscreteScheduler(shift=shift)
    scheduler.set_timesteps(sigmas=[1.0 - i / steps for i in range(steps)])
    x = noise.float()
    for i, (t, sigma) in enumerate(zip(scheduler.timesteps, scheduler.sigmas[:-1].tolist())):
        x0 = first_x0.float() if i == 0 and first_x0 is not None else predict_x0(x, sigma)
        velocity = (x - x0) / sigma
        x = scheduler.step(velocity, t, x, return_dict=False)[0]
    return x


def fork_rng(rng: torch.Generator) -> torch.Generator:
    """A child generator for a forked state, seeded from (and advancing) the parent's, so
    branches of one session draw different but reproducible noise."""
    return torch.Generator().manual_seed(int(torch.randint(0, 2**62, (1,), generator=rng)))
