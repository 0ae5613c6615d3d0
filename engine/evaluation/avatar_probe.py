"""The avatar probe: a small CNN fitted on simulator frames of training seeds (half of them
blurred, as an autoencoder blurs) that regresses the simulator's pose (head turn, mouth
openness, face parameters, eyelids) from a frame; the evaluation reads the mouth with it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

from worldstream.engine.worlds.avatar.looks import LOOK_NAMES
from worldstream.engine.worlds.avatar.recorder import PuppeteerPolicy
from worldstream.engine.worlds.avatar.simulator import FACE_PARAMS, FACE_TABLE, AvatarSimulator

PROBE_PATH = Path("runs/avatar_probe.pt")


class AvatarProbe(nn.Module):
    """CNN on the 96×96 centre crop of a frame (head and neck at full resolution: brows and
    eyelids move by 1-3 px) regressing the simulator's pose: ``(N, 10)`` = yaw, pitch, mouth
    openness (viseme plus the expression's jaw), the six ``FACE_PARAMS`` and the eyelid
    closure. :meth:`read` turns them into the metrics' classes."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(3, 32, 5, 2, 2), nn.ReLU(), nn.Conv2d(32, 64, 3, 2, 1), nn.ReLU(),
            nn.Conv2d(64, 64, 3, 2, 1), nn.ReLU(), nn.Flatten(), nn.Linear(64 * 12 * 12, 128),
            nn.ReLU(), nn.Linear(128, 3 + len(FACE_PARAMS) + 1))

    @staticmethod
    def prepare(frames: np.ndarray) -> torch.Tensor:
        """``(N, 128, 128, 3)`` uint8 -> ``(N, 3, 96, 96)`` float32 in [-1, 1]."""
        crop = np.asarray(frames)[:, 8:104, 16:112]
        return torch.as_tensor(crop).permute(0, 3, 1, 2).float() / 127.5 - 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)

    @torch.no_grad()
    def read(self, frames: np.ndarray) -> dict[str, np.ndarray]:
        """Per frame: ``expression`` (int: the expression whose face is nearest, L1, to the
        probed face parameters) and ``mouth`` (float: the probed openness)."""
        out = torch.cat([self(self.prepare(frames[i : i + 256]))
                         for i in range(0, len(frames), 256)]).numpy()
        face = out[:, 3 : 3 + len(FACE_PARAMS)]
        expression = np.abs(face[:, None] - FACE_TABLE[None]).sum(-1).argmin(1)
        return {"expression": expression, "mouth": out[:, 2]}


def probe_target(sim: AvatarSimulator) -> np.ndarray:
    """``(10,)`` float32: what :class:`AvatarProbe` regresses, from the simulator's pose."""
    p = sim.pose
    return np.array([p.yaw, p.pitch, p.face[4] + p.mouth_open, *p.face, p.blink], np.float32)


def _blur(x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Blur half the images (3×3 box once or twice): what an autoencoder does to edges."""
    hit = torch.rand(len(x), generator=gen) < 0.5
    once = F.avg_pool2d(x, 3, 1, 1, count_include_pad=False)
    twice = F.avg_pool2d(once, 3, 1, 1, count_include_pad=False)
    pick = torch.where((torch.rand(len(x), generator=gen) < 0.5)[:, None, None, None], once,
                       twice)
    return torch.where(hit[:, None, None, None], pick, x)


def fit_probe(episodes: int = 96, length: int = 64, steps: int = 3000,
              seed: int = 0) -> AvatarProbe:
    """Fit :class:`AvatarProbe` on random puppeteering (``recorder.PuppeteerPolicy``) of
    training seeds, every look, half the frames blurred; targets :func:`probe_target`."""
    from worldstream.engine.training.avatar_data import TRAIN_SEED0

    frames, targets = [], []
    for k in tqdm(range(episodes), desc="probe data", unit="episode", leave=False):
        rng = np.random.default_rng([TRAIN_SEED0 + k, 3])
        sim = AvatarSimulator(TRAIN_SEED0 + k, LOOK_NAMES[k % len(LOOK_NAMES)])
        policy = PuppeteerPolicy(rng)
        for _ in range(length):
            frames.append(sim.step(policy()))
            targets.append(probe_target(sim))
    x = AvatarProbe.prepare(np.stack(frames))
    y = torch.as_tensor(np.stack(targets))
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    probe = AvatarProbe()
    opt = torch.optim.AdamW(probe.parameters(), lr=1e-3)
    for _ in tqdm(range(steps), desc="fitting the probe", unit="step", leave=False):
        i = torch.randint(0, len(x), (64,), generator=gen)
        loss = F.mse_loss(probe(_blur(x[i], gen)), y[i])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return probe.eval()


def load_probe(path: Path = PROBE_PATH) -> AvatarProbe:
    """The fitted probe, cached at ``path`` (fitted and saved when missing)."""
    probe = AvatarProbe()
    if path.exists():
        probe.load_state_dict(torch.load(path))
        return probe.eval()
    probe = fit_probe()
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(probe.state_dict(), path)
    return probe
