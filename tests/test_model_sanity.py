"""The shipped model does what a denoiser must (DESIGN.md: test the sampler before trusting
rollouts): a true chunk noised to a small level comes back closer to the truth, and the first
step from pure noise moves toward the data."""

import numpy as np
import torch

from engine.evaluation.run import record
from engine.generator import load_builtin_backend
from engine.models.attention import DenseContext, block_causal_frame_mask, expand_frame_mask
from engine.models.autoencoder import frames_to_tensor
from engine.text import embed


def test_shipped_model_denoises_toward_the_truth():
    gen = load_builtin_backend()
    m = gen.model
    ep = record(900_777, 4, scene="meadow")
    with torch.no_grad():
        z = m.normalize(gen.ae.encoder(frames_to_tensor(ep.frames)).float())[None]  # (1,4,C,h,w)
        mask = expand_frame_mask(block_causal_frame_mask(4, 2), m.tokens_per_frame)
        prev = torch.cat([torch.zeros_like(z[:, :2]), z[:, 1:2].expand(-1, 2, -1, -1, -1)], 1)
        prev_sig = torch.tensor([[1.0, 1.0, 0.05, 0.05]])
        act = torch.tensor([ep.actions])
        txt = torch.as_tensor(np.array(embed(ep.prompt)))[None, None].expand(1, 4, -1)
        pos = torch.arange(4)[None]
        noise = torch.randn(z.shape, generator=torch.Generator().manual_seed(0))
        errors = {}
        for sigma in (0.25, 1.0):
            x = z.clone()
            x[:, 2:] = (1 - sigma) * z[:, 2:] + sigma * noise[:, 2:]
            sig = torch.tensor([[0.05, 0.05, sigma, sigma]])
            pred = m(x, prev, prev_sig, sig, act, txt, pos, DenseContext(mask))
            errors[sigma] = (
                (((pred - z)[:, 2:]) ** 2).mean().item(),
                (((x - z)[:, 2:]) ** 2).mean().item(),
            )
    # the prediction must beat its noisy input: by far from pure noise, clearly near the data
    after, before = errors[1.0]
    assert after < 0.5 * before, (1.0, after, before)
    after, before = errors[0.25]
    assert after < 0.8 * before, (0.25, after, before)
