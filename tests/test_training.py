"""Training plumbing on tiny data: noise-level sampling, frame feeding, resume, export; the
sampler against an oracle."""

import numpy as np
import torch

from engine.models.attention import DenseContext, block_causal_frame_mask, expand_frame_mask
from engine.models.world_dit import WorldDiT, shift_frames
from engine.sampler import denoise
from engine.training.latents import LatentDataset
from engine.training.train_world import (
    camera_motion_target,
    generated_chunk,
    previous_frames,
    sample_chunk_sigmas,
    train_world,
)


def test_chunk_sigmas_mix_diffusion_forcing_and_clean_context():
    sig = sample_chunk_sigmas(torch.Generator().manual_seed(0), 4000, 4, ctx_sigma_max=0.15,
                              p_context=0.9)
    assert sig.shape == (4000, 4) and (sig >= 0).all() and (sig <= 1).all()
    low = (sig <= 0.15).float().mean().item()
    # context rows (0.9) hold k ~ U{1,2,3} context chunks of 4: 0.9 * 0.5 = 0.45; the other
    # chunks are logit-normal, 4.1% of which fall below 0.15: + 0.55 * 0.041
    assert 0.44 < low < 0.51
    assert (sig[:, 0] <= 0.15).float().mean().item() > 0.88  # a row's first chunk: context


def test_previous_frames_feed_the_last_frame_of_the_previous_chunk():
    x = torch.arange(6.0).view(1, 6, 1, 1, 1).expand(1, 6, 2, 2, 2)
    sig = torch.tensor([[0.1, 0.1, 0.5, 0.5, 0.9, 0.9]])
    prev, prev_sig = previous_frames(x, sig, chunk_frames=2)
    assert prev[0, :, 0, 0, 0].tolist() == [0, 0, 1, 1, 3, 3]
    assert (prev[0, :2] == 0).all()
    assert torch.allclose(prev_sig, torch.tensor([[1, 1, 0.1, 0.1, 0.5, 0.5]]))


def test_camera_motion_target_is_the_displacement_from_the_prev_frame():
    cam = torch.tensor([[[0, 0], [8, 0], [16, 4], [24, 8], [24, 8], [24, 16]]]).float()
    target, has_prev = camera_motion_target(cam, chunk_frames=2, latent_scale=8.0)
    assert has_prev.tolist() == [False, False, True, True, True, True]
    # frames 2, 3 are measured from frame 1 at (8, 0); frames 4, 5 from frame 3 at (24, 8)
    assert target[0, 2:].tolist() == [[1, 0.5], [2, 1], [0, 0], [0, 1]]


def test_shift_frames_moves_content_against_the_camera():
    x = torch.randn(2, 3, 8, 8)
    out = shift_frames(x, torch.tensor([[2.0, 0.0], [0.0, -1.0]]))
    assert torch.allclose(out[0, :, :, :6], x[0, :, :, 2:], atol=1e-5)  # camera right: content left
    assert torch.allclose(out[1, :, 1:], x[1, :, :7], atol=1e-5)  # camera up: content down
    half = shift_frames(x, torch.tensor([[0.5, 0.0], [0.0, 0.0]]))
    assert torch.allclose(half[0, :, :, :7], (x[0, :, :, :7] + x[0, :, :, 1:]) / 2, atol=1e-5)
    assert torch.allclose(half[1], x[1], atol=1e-5)


def test_motion_warp_bases_the_prediction_on_the_shifted_previous_frame():
    torch.manual_seed(0)
    m = WorldDiT(dim=32, depth=1, num_heads=1, residual=True, motion_warp=True).eval()
    torch.nn.init.zeros_(m.out.weight)
    torch.nn.init.zeros_(m.out.bias)
    with torch.no_grad():
        m.motion[2].bias.copy_(torch.tensor([1.0, 0.0]))  # camera: one latent pixel right
    prev = torch.randn(1, 2, 8, 16, 16)
    ctx = DenseContext(expand_frame_mask(block_causal_frame_mask(2, 2), m.tokens_per_frame))
    args = (torch.randn(1, 2, 8, 16, 16), prev, torch.full((1, 2), 0.25), torch.ones(1, 2),
            torch.full((1, 2), 5), torch.zeros(1, 2, 384), torch.arange(2)[None], ctx)
    with torch.no_grad():
        x0, motion = m(*args, return_motion=True)
    assert torch.allclose(motion, torch.tensor([[[1.0, 0.0], [1.0, 0.0]]]))
    assert torch.allclose(x0[..., :15], 0.75 * prev[..., 1:], atol=1e-5)


def test_generated_chunk_replaces_only_chunk_k_with_the_models_prediction():
    torch.manual_seed(0)
    m = WorldDiT(dim=32, depth=1, num_heads=1, residual=True, motion_warp=True)
    torch.nn.init.normal_(m.out.weight, std=0.1)  # a model whose output is not just the input
    z = torch.randn(2, 6, 8, 16, 16)
    ctx = DenseContext(expand_frame_mask(block_causal_frame_mask(6, 2), m.tokens_per_frame))
    cond = (torch.full((2, 6), 4), torch.zeros(2, 6, 384), torch.arange(6)[None].repeat(2, 1), ctx)
    out = generated_chunk(m, z, torch.tensor([0, 1]), torch.Generator().manual_seed(0), 2, cond)
    assert not out.requires_grad
    same = (out == z).flatten(2).all(-1)  # (B, F) frames left as they were
    assert same.tolist() == [[False, False, True, True, True, True],
                             [True, True, False, False, True, True]]


def test_denoise_with_an_oracle_returns_the_data():
    x0 = torch.randn(2, 2, 8, 16, 16)
    for steps in (1, 2, 4):
        out = denoise(lambda x, s: x0, torch.randn_like(x0), steps)
        assert torch.allclose(out, x0, atol=1e-5)


def test_train_world_resumes_and_exports(tmp_path):
    g = torch.Generator().manual_seed(0)
    data = LatentDataset(
        torch.randn(3, 12, 8, 16, 16, generator=g).half(),
        torch.randint(0, 9, (3, 12), generator=g),
        torch.randint(0, 2, (3, 12), generator=g),
        torch.randn(2, 384),
        torch.cumsum(torch.randint(-6, 7, (3, 12, 2), generator=g), dim=1),
    )
    kw = dict(
        batch=2,
        frames=4,
        chunk_frames=2,
        dim=32,
        depth=1,
        num_heads=1,
        ckpt_every=1,
        export_every=100,
        residual=True,
        motion_warp=True,
        p_generated=0.5,
    )
    first = train_world(data, tmp_path / "out", tmp_path / "run", steps=2, **kw)
    assert first["steps"] == 2
    again = train_world(data, tmp_path / "out", tmp_path / "run", steps=3, **kw)
    assert again["steps"] == 3 and np.isfinite(again["final_loss"])
    model = WorldDiT.from_pretrained(tmp_path / "out")
    assert model.config.latent_mean is not None and len(model.config.latent_std) == 8
    assert model.config.motion_warp and model.motion[2].weight.abs().sum() > 0
