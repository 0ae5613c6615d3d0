"""Learned camera motion of the built-in world model (``WorldDiT.camera``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class CameraDynamics(nn.Module):
    """Learned camera motion: ``v_t = v_{t-1} + L([v_{t-1}, a_t]) + MLP([v_{t-1}, a_t])`` with
    the action one-hot, in image pixels per frame; the camera position is the running sum of
    ``v``. A linear part (momentum and thrust: what a camera with inertia mostly is) plus a
    small MLP for the rest; fitted to the simulator's recorded camera paths
    (``engine.training.train_world.fit_camera_dynamics``). Recurrent because a world with
    inertia needs the velocity as state."""

    def __init__(self, num_actions: int, hidden: int = 64):
        super().__init__()
        self.num_actions = num_actions
        self.linear = nn.Linear(2 + num_actions, 2)
        self.mlp = nn.Sequential(
            nn.Linear(2 + num_actions, hidden), nn.SiLU(), nn.Linear(hidden, 2)
        )
        for layer in (self.linear, self.mlp[2]):  # zero at init: the camera stays put
            nn.init.zeros_(layer.weight)
            nn.init.zeros_(layer.bias)

    def forward(self, vel: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """``vel (N, 2)`` float32 px/frame, ``actions (N,)`` int64 -> next velocity ``(N, 2)``."""
        hot = F.one_hot(actions, self.num_actions).to(vel.dtype)
        x = torch.cat([vel, hot], dim=-1).to(self.linear.weight.dtype)
        return vel + (self.linear(x) + self.mlp(x)).float()

    @torch.no_grad()
    def rollout(
        self, vel: torch.Tensor, actions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Displacements of a sequence: ``vel (2,)`` before it, ``actions (T,)`` ->
        ``(T, 2)`` float32 per-frame displacement (px) and the final velocity ``(2,)``."""
        out = []
        v = vel.float()[None]
        for a in actions.reshape(-1):
            v = self(v, a.reshape(1))
            out.append(v[0])
        return torch.stack(out), v[0]
