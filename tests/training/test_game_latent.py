"""The per-frame latent's KL term, hand-worked: a posterior pinned to ``mu = 1, logvar = 0`` in
each of ``D`` dimensions costs ``D / 2`` nats per frame, joins the loss over the weighted pixel
count, and free bits lift it to ``kl_free`` nats when it is below."""

import pytest
import torch

from worldstream.engine.models.game.unet import GameUNet
from worldstream.engine.training.game.train import GameTrainConfig, _clip_loss

DIM, BATCH, SIZE = 4, 3, 8


def _loss(monkeypatch, kl_weight: float, kl_free: float) -> tuple[float, float, float]:
    torch.manual_seed(0)
    unet = GameUNet(num_colours=3, num_actions=2, context=2, channels=(8, 16), size=SIZE,
                    latent_dim=DIM)
    monkeypatch.setattr(unet, "posterior", lambda nxt, last: (
        torch.ones(len(nxt), DIM), torch.zeros(len(nxt), DIM)))
    gen = torch.Generator().manual_seed(1)
    frames = torch.randint(0, 3, (BATCH, 3, SIZE, SIZE), generator=gen)
    actions = torch.randint(0, 2, (BATCH, 2), generator=gen)
    cfg = GameTrainConfig(env="toy", out="-", context=2, unroll=1, corrupt=0.0,
                          latent_dim=DIM, kl_weight=kl_weight, kl_free=kl_free,
                          code_grid=0, loss_cutoff=0.0)
    changed = (frames[:, 2] != frames[:, 1]).sum().item()
    weights = BATCH * SIZE * SIZE + (cfg.change_weight - 1) * changed
    loss, kl = _clip_loss(unet, frames, actions, cfg, torch.Generator().manual_seed(2))
    return loss.item(), kl, weights


def test_the_kl_joins_the_loss_per_frame_over_the_weighted_pixels(monkeypatch):
    base, kl, weights = _loss(monkeypatch, kl_weight=0.0, kl_free=0.0)
    with_kl, _, _ = _loss(monkeypatch, kl_weight=1.0, kl_free=0.0)
    assert kl == pytest.approx(DIM / 2)
    assert with_kl - base == pytest.approx(BATCH * DIM / 2 / weights, rel=1e-4)


def test_free_bits_charge_at_least_kl_free_nats_per_frame(monkeypatch):
    base, _, weights = _loss(monkeypatch, kl_weight=0.0, kl_free=0.0)
    lifted, kl, _ = _loss(monkeypatch, kl_weight=1.0, kl_free=5.0)
    assert kl == pytest.approx(DIM / 2)  # what the latent carries, not what it is charged
    assert lifted - base == pytest.approx(BATCH * 5.0 / weights, rel=1e-4)
