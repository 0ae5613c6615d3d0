"""A flow game world's sampling, hand-worked: ``next_frame`` integrates from the noise draw in
``flow_steps`` Euler steps at levels 0, 1/n, ... towards the network's expected clean frame and
returns the last step's argmax; training feeds the network ``t x + (1 - t) e`` at levels on
play's grid half the time."""

import numpy as np
import pytest
import torch

from worldstream.engine.models.game.palette import Palette
from worldstream.engine.models.game.unet import GameUNet
from worldstream.engine.models.game.world import GameWorld
from worldstream.engine.training.game.train import GameTrainConfig, _clip_loss, flow_levels

K, S = 3, 8
PALETTE = Palette(np.array([[0, 0, 0], [255, 0, 0], [255, 255, 255]], np.uint8))


class _Recorder(torch.nn.Module):
    """Stands for the network: fixed logits ``(B, K, S, S)``, and what it was given."""

    def __init__(self, logits: torch.Tensor, flow_steps: int):
        super().__init__()
        self.fixed = logits
        self.config = {"flow_steps": flow_steps, "context": 2}
        self.calls: list[tuple[torch.Tensor, torch.Tensor]] = []

    def forward(self, frames, actions, z, noisy, level):
        self.calls.append((noisy.clone(), level.clone()))
        return self.fixed


def test_next_frame_takes_euler_steps_towards_the_expected_clean_frame():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(2, K, S, S, generator=gen)
    net = _Recorder(logits, flow_steps=3)
    world = GameWorld(net, PALETTE, "toy", S, ("NOOP",), 1.0)
    noise = torch.randn(2, 3, S, S, generator=gen)
    frames = torch.zeros(2, 2, S, S, dtype=torch.long)
    out = world.next_frame(frames, torch.zeros(2, 2, dtype=torch.long), noise)
    rgb = torch.tensor(PALETTE.colours, dtype=torch.float32) / 127.5 - 1
    clean = (logits.softmax(1)[:, :, None] * rgb[None, :, :, None, None]).sum(1)  # (B, 3, S, S)
    x1 = noise + (clean - noise) / 3          # t 0 -> 1/3: dt / (1 - t) = 1/3
    x2 = x1 + (clean - x1) / 2                # t 1/3 -> 2/3: dt / (1 - t) = 1/2
    levels = [call[1] for call in net.calls]
    torch.testing.assert_close(torch.stack(levels), torch.tensor([[0.0] * 2, [1 / 3] * 2,
                                                                  [2 / 3] * 2]))
    for got, want in zip([c[0] for c in net.calls], [noise, x1, x2], strict=True):
        torch.testing.assert_close(got, want)
    assert torch.equal(out, logits.argmax(1))


def test_the_same_draw_gives_the_same_frame_and_another_draw_can_differ():
    torch.manual_seed(0)
    unet = GameUNet(num_colours=K, num_actions=2, context=2, channels=(8, 16), size=S,
                    flow_steps=2).eval()
    with torch.no_grad():
        for p in unet.parameters():
            p.normal_(0, 0.5)
    world = GameWorld(unet, PALETTE, "toy", S, ("NOOP", "FIRE"), 1.0)
    frames = torch.zeros(1, 2, S, S, dtype=torch.long)
    actions = torch.zeros(1, 2, dtype=torch.long)
    first = world.next_frame(frames, actions, world.noise(7, 3)[None])
    assert torch.equal(first, world.next_frame(frames, actions, world.noise(7, 3)[None]))
    others = [world.next_frame(frames, actions, world.noise(7, k)[None]) for k in range(4, 8)]
    assert any(not torch.equal(first, o) for o in others)
    assert torch.equal(world.noise(7, 3), world.noise(7, 3))
    assert world.noise(7, 3).shape == (3, S, S)


def test_training_levels_sit_on_plays_grid_half_the_time():
    levels = flow_levels(20_000, 3, torch.Generator().manual_seed(0))
    assert ((levels >= 0) & (levels < 1)).all()
    on_grid = torch.isclose(levels[:, None], torch.tensor([0.0, 1 / 3, 2 / 3])).any(1)
    assert on_grid.float().mean().item() == pytest.approx(0.5, abs=0.02)


def test_training_feeds_the_clean_frame_mixed_with_unit_noise_at_its_level():
    seen = []

    class _Net(torch.nn.Module):
        def forward(self, frames, actions, z, noisy, level):
            seen.append((noisy, level))
            return torch.zeros(len(frames), K, S, S, requires_grad=True)

    gen = torch.Generator().manual_seed(1)
    frames = torch.randint(0, K, (64, 3, S, S), generator=gen)
    actions = torch.zeros(64, 3, dtype=torch.long)
    cfg = GameTrainConfig(env="toy", out="-", context=2, unroll=1, corrupt=0.0, latent_dim=0,
                          flow_steps=3)
    rgb = torch.from_numpy(PALETTE.signed())
    _clip_loss(_Net(), frames, actions, cfg, torch.Generator().manual_seed(2), rgb)
    noisy, level = seen[0]
    t = level[:, None, None, None]
    eps = (noisy - t * rgb[frames[:, 2]].permute(0, 3, 1, 2)) / (1 - t)
    assert abs(eps.mean().item()) < 0.03 and eps.std().item() == pytest.approx(1.0, abs=0.03)
