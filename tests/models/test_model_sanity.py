"""The shipped model does what a denoiser must (the field's practice: test the sampler before
trusting rollouts): a true frame noised to a small level comes back closer to the truth, the first
step from pure noise moves toward the data, and its camera dynamics follow the simulator's
camera."""

import numpy as np
import torch

from worldstream.engine.backends.builtin import load_builtin_backend
from worldstream.engine.evaluation.episodes import record
from worldstream.engine.models.builtin.attention import (
    DenseContext,
    block_causal_frame_mask,
    expand_frame_mask,
)
from worldstream.engine.models.builtin.text import embed
from worldstream.engine.training.latents import memory_bases


def test_shipped_model_denoises_toward_the_truth():
    gen = load_builtin_backend()
    m = gen.model
    n = 4
    ep = record(900_777, n, scene="meadow")
    with torch.no_grad():
        z = gen.encode_frames(ep.frames)[None]
        recon = gen.decode_latents(z[0])
        pictures, known = memory_bases(recon, ep.offsets, np.zeros(n, bool), 1)
        base = gen.encode_frames(pictures)[None]
        known = torch.as_tensor(known)[None]
        mask = expand_frame_mask(block_causal_frame_mask(n, 1), m.tokens_per_frame)
        act = torch.tensor([ep.actions])
        txt = torch.as_tensor(np.array(embed(ep.prompt)))[None, None].expand(1, n, -1)
        noise = torch.randn(z.shape, generator=torch.Generator().manual_seed(0))
        errors = {}
        for sigma in (0.25, 1.0):
            x = z.clone()
            x[:, 2:] = (1 - sigma) * z[:, 2:] + sigma * noise[:, 2:]
            sig = torch.tensor([[0.05, 0.05, sigma, sigma]])
            base_sig = torch.full((1, n), 0.05)
            pred = m(x, base, base_sig, known, sig, act, txt, torch.arange(n)[None],
                     DenseContext(mask))
            errors[sigma] = (
                (((pred - z)[:, 2:]) ** 2).mean().item(),
                (((x - z)[:, 2:]) ** 2).mean().item(),
            )
    # the prediction must beat its noisy input: by far from pure noise, clearly near the data
    after, before = errors[1.0]
    assert after < 0.5 * before, (1.0, after, before)
    after, before = errors[0.25]
    assert after < 0.8 * before, (0.25, after, before)


def test_shipped_camera_dynamics_follow_the_simulator():
    gen = load_builtin_backend()
    for seed in (900_900, 900_902, 900_903):
        ep = record(seed, 60)
        disp, _ = gen.model.camera.rollout(torch.zeros(2), torch.tensor(ep.actions))
        path = torch.cumsum(disp, 0).numpy()
        truth = ep.offsets - ep.offsets[0]
        assert np.abs(truth).max() > 40  # the episode moves
        assert np.abs(path - path[0] - truth).max() < 2.0  # measured: < 0.9 px
