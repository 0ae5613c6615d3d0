"""Training plumbing on tiny data: noise-level sampling, frame feeding, resume, export; the
sampler against an oracle."""

import numpy as np
import torch

from engine.models.world_dit import WorldDiT
from engine.sampler import denoise
from engine.training.latents import LatentDataset
from engine.training.train_world import previous_frames, sample_chunk_sigmas, train_world


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
    )
    first = train_world(data, tmp_path / "out", tmp_path / "run", steps=2, **kw)
    assert first["steps"] == 2
    again = train_world(data, tmp_path / "out", tmp_path / "run", steps=3, **kw)
    assert again["steps"] == 3 and np.isfinite(again["final_loss"])
    model = WorldDiT.from_pretrained(tmp_path / "out")
    assert model.config.latent_mean is not None and len(model.config.latent_std) == 8
