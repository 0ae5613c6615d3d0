"""``GameUNet``: the next frame's palette logits from the last frames and actions.

Context frames enter as learned colour embeddings stacked on channels (DIAMOND stacks its 4
context frames the same way); the actions of the context and of the predicted frame condition
every residual block through adaptive group norm (a scale and shift per channel). The logits
start from the last frame copied (a learned gain on its one-hot), so the network spends its
capacity on what changes.

With ``code_grid > 0`` a discrete *outcome code* enters beside the context frames: a
``code_grid`` x ``code_grid`` map of categorical tokens of ``code_classes`` values, one token per
cell of the frame (a cell says what appears or changes there that the past does not settle:
the serve's ball in this cell, an enemy's step). In training ``posterior`` reads it off the
true next frame; the prior ``code_prior`` learns to predict it from the context and actions,
and play *samples* one token per cell from it and carries that outcome out, sharp. The code
enters as ``code_classes`` one-hot channels scaled up to the frame (a conv network finds a
cell's outcome where it happens), an all-zero code (no token) being the dropped code training
also shows, so the network still learns what the actions alone decide.

``latent_dim > 0`` is the older continuous latent (a conditional VAE, play feeding ``z = 0``),
kept so folders trained with it load as before.

Settings that left the network (``RETIRED``) are read from an older ``config.json`` only at
the value the network has now, so a folder saved before their removal loads as before.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.models.modeling_utils import ModelMixin
from torch import nn

#: setting -> (the value the code has now, the commit whose code has the setting): probes that
#: did not ship (assets/games/EXPERIMENTS.md); a config or record holding another value needs
#: that commit's code
RETIRED = {"latent_prior": (False, "b2905c2"), "flow_steps": (0, "d42b936")}


def drop_retired(config: dict) -> dict:
    """``config`` (a ``config.json``'s or a training record's) without its ``RETIRED``
    settings; ValueError naming the commit for one not at the value the code has now."""
    for key, (now, commit) in RETIRED.items():
        if key in config and config[key] != now:
            raise ValueError(f"{key}={config[key]!r}: a setting that left the code (a probe "
                             f"that did not ship); its code is at commit {commit}")
    return {k: v for k, v in config.items() if k not in RETIRED}


class _Block(nn.Module):
    """Residual conv block with adaptive group norm from the action vector."""

    def __init__(self, cin: int, cout: int, cond: int):
        super().__init__()
        self.norm1 = nn.GroupNorm(8, cin, affine=False)
        self.conv1 = nn.Conv2d(cin, cout, 3, padding=1)
        self.norm2 = nn.GroupNorm(8, cout, affine=False)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1)
        self.film = nn.Linear(cond, 2 * (cin + cout))
        self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()
        nn.init.zeros_(self.film.weight)
        nn.init.zeros_(self.film.bias)

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        s1, b1, s2, b2 = torch.split(self.film(c)[:, :, None, None],
                                     [x.shape[1], x.shape[1], self.conv1.out_channels,
                                      self.conv1.out_channels], dim=1)
        h = self.conv1(F.silu(self.norm1(x) * (1 + s1) + b1))
        h = self.conv2(F.silu(self.norm2(h) * (1 + s2) + b2))
        return self.skip(x) + h


def _frame_encoder(cin: int, size: int, out: int) -> nn.Sequential:
    """``(B, cin, size, size)`` -> ``(B, out)``: three stride-2 convs to ``size / 8`` squared
    and a linear map (the flatten keeps where things are)."""
    return nn.Sequential(
        nn.Conv2d(cin, 32, 3, stride=2, padding=1), nn.SiLU(),
        nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.SiLU(),
        nn.Conv2d(64, 32, 3, stride=2, padding=1), nn.SiLU(), nn.Flatten(),
        nn.Linear(32 * ((size + 7) // 8) ** 2, out))


class _Posterior(nn.Module):
    """``q(z | next frame, last frame)``: the two frames' colour embeddings stacked to ``(mu,
    logvar)`` ``(B, latent)`` each."""

    def __init__(self, colour_dim: int, latent_dim: int, size: int):
        super().__init__()
        self.net = _frame_encoder(2 * colour_dim, size, 2 * latent_dim)

    def forward(self, pair: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mu, logvar = self.net(pair).float().chunk(2, dim=1)
        return mu, logvar.clamp(-8.0, 4.0)


def _grid_encoder(cin: int, size: int, grid: int, out: int) -> nn.Sequential:
    """``(B, cin, size, size)`` -> ``(B, out, grid, grid)``: stride-2 convs down to the grid
    (``size / grid`` a power of two), then a 1x1 map to ``out`` logits per cell."""
    layers: list[nn.Module] = []
    width, at = cin, size
    for w in (32, 64, 64, 64, 64, 64):
        if at <= grid:
            break
        layers += [nn.Conv2d(width, w, 3, stride=2, padding=1), nn.SiLU()]
        width, at = w, (at + 1) // 2
    layers += [nn.Conv2d(width, width, 3, padding=1), nn.SiLU(), nn.Conv2d(width, out, 1)]
    return nn.Sequential(*layers)


class CodePrior(nn.Module):
    """``p(code | context frames, actions)``: independent categoricals, one per cell of the
    code's grid, from the context's colour embeddings (stacked on channels) with the actions'
    embedding added to every position.

    ``logits(frames, actions)``: frames ``(B, context, H, W)`` long, actions ``(B, context)``
    long -> ``(B, cells, classes)`` float logits (cells in raster order). ``sample(logits,
    u)``: codes ``(B, cells)`` long drawn by inverse CDF from ``u`` ``(B, cells)`` uniforms in
    [0, 1) (None: each cell's most likely value), so a draw is a function of its inputs (exact
    replay).
    """

    def __init__(self, num_colours: int, num_actions: int, context: int, grid: int,
                 classes: int, size: int):
        super().__init__()
        self.grid, self.classes = grid, classes
        self.colour = nn.Embedding(num_colours, 8)
        self.action = nn.Embedding(num_actions, 16)
        self.mix = nn.Linear(16 * context, 8 * context)
        self.net = _grid_encoder(8 * context, size, grid, classes)

    def logits(self, frames: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        b, t, h, w = frames.shape
        x = self.colour(frames).permute(0, 1, 4, 2, 3).reshape(b, -1, h, w)
        x = x + self.mix(self.action(actions).reshape(b, -1))[:, :, None, None]
        return self.net(x).float().flatten(2).transpose(1, 2)

    def sample(self, logits: torch.Tensor, u: torch.Tensor | None) -> torch.Tensor:
        if u is None:
            return logits.argmax(-1)
        cdf = logits.softmax(-1).cumsum(-1)
        pick = (cdf < u.to(cdf)[..., None]).sum(-1)
        return pick.clamp(max=self.classes - 1)


class GameUNet(ModelMixin, ConfigMixin):
    """Args (saved in ``config.json``):
        num_colours: palette size K. num_actions: the env's action count.
        context: context frames (and context actions). channels: widths per resolution
        (each level halves the frame). colour_dim: embedding width of a palette colour.
        action_dim: embedding width of an action. latent_dim: width of the older continuous
        latent ``z`` (0: none). size: frame size (pixels). code_grid, code_classes: the
        outcome code's cells per side and values per cell (0: no code).
    ``forward(frames, actions, z=None) -> logits``: frames ``(B, context, H, W)`` long palette
    indices (oldest first), actions ``(B, context)`` long (the action after each context
    frame; the last one leads to the predicted frame), ``z`` the frame's outcome code as
    ``(B, code_classes, code_grid, code_grid)`` float one-hots (or the continuous ``(B,
    latent_dim)``; None: zeros, the dropped code) -> ``(B, K, H, W)`` float logits.
    ``posterior(next_frame, last_frame)``: training's code logits ``(B, cells, code_classes)``
    float (or the continuous latent's ``(mu, logvar)``) from two ``(B, H, W)`` long frames.
    ``code_prior``: the :class:`CodePrior` play samples codes from.
    """

    @register_to_config
    def __init__(self, num_colours: int = 16, num_actions: int = 4, context: int = 4,
                 channels: tuple[int, ...] = (32, 64, 96), colour_dim: int = 8,
                 action_dim: int = 32, size: int = 64, latent_dim: int = 0,
                 code_grid: int = 0, code_classes: int = 8):
        super().__init__()
        if code_grid and (size % code_grid or (size // code_grid) & (size // code_grid - 1)):
            raise ValueError(f"code_grid {code_grid} must divide size {size} by a power of two")
        if latent_dim and code_grid:
            raise ValueError("a network has the continuous latent or the outcome code, not both")
        self.colour = nn.Embedding(num_colours, colour_dim)
        self.action = nn.Embedding(num_actions, action_dim)
        cond = 2 * action_dim
        self.cond = nn.Sequential(nn.Linear(context * action_dim + latent_dim, cond), nn.SiLU(),
                                  nn.Linear(cond, cond))
        code_in = code_classes if code_grid else 0
        self.stem = nn.Conv2d(context * colour_dim + code_in, channels[0], 3, padding=1)
        self.down = nn.ModuleList()
        self.pool = nn.ModuleList()
        for i, ch in enumerate(channels):
            prev = channels[max(i - 1, 0)]
            self.down.append(_Block(prev, ch, cond))
            self.pool.append(nn.Conv2d(ch, ch, 3, stride=2, padding=1)
                             if i < len(channels) - 1 else nn.Identity())
        self.mid = _Block(channels[-1], channels[-1], cond)
        self.up = nn.ModuleList()
        for i in reversed(range(len(channels))):
            below = channels[min(i + 1, len(channels) - 1)]
            self.up.append(_Block(below + channels[i], channels[i], cond))
        self.out = nn.Conv2d(channels[0], num_colours, 3, padding=1)
        self.copy_gain = nn.Parameter(torch.tensor(4.0))
        nn.init.zeros_(self.out.weight)
        nn.init.zeros_(self.out.bias)
        self.posterior_net = _Posterior(colour_dim, latent_dim, size) if latent_dim else None
        self.code_posterior = (_grid_encoder(2 * colour_dim, size, code_grid, code_classes)
                               if code_grid else None)
        self.code_prior = (CodePrior(num_colours, num_actions, context, code_grid,
                                     code_classes, size) if code_grid else None)

    @property
    def code_cells(self) -> int:
        """Tokens of the outcome code per frame (``code_grid ** 2``; 0: no code)."""
        return int(self.config.code_grid) ** 2

    @classmethod
    def extract_init_dict(cls, config_dict: dict, **kwargs):
        # diffusers would only warn about a retired key and build the network without it
        return super().extract_init_dict(drop_retired(config_dict), **kwargs)

    def posterior(self, next_frame: torch.Tensor, last_frame: torch.Tensor) -> Any:
        pair = torch.cat([self.colour(next_frame), self.colour(last_frame)], -1)
        pair = pair.permute(0, 3, 1, 2)
        if self.code_posterior is not None:
            return self.code_posterior(pair).float().flatten(2).transpose(1, 2)
        if self.posterior_net is None:
            raise ValueError("this network has no latent (latent_dim=0) and no code")
        return self.posterior_net(pair)

    def code_map(self, onehots: torch.Tensor) -> torch.Tensor:
        """``(B, cells, classes)`` float one-hots (raster order) -> ``(B, classes, grid,
        grid)``, the code ``forward`` reads."""
        g = int(self.config.code_grid)
        return onehots.transpose(1, 2).reshape(len(onehots), -1, g, g)

    def code_onehot(self, codes: torch.Tensor) -> torch.Tensor:
        """``(B, cells)`` long codes -> ``(B, classes, grid, grid)`` float one-hots."""
        return self.code_map(F.one_hot(codes, self.config.code_classes).float())

    def _inputs(self, frames: torch.Tensor,
                actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        b, t, h, w = frames.shape
        x = self.colour(frames).permute(0, 1, 4, 2, 3).reshape(b, -1, h, w)
        return x, self.action(actions).reshape(b, -1)

    def forward(self, frames: torch.Tensor, actions: torch.Tensor,
                z: torch.Tensor | None = None) -> torch.Tensor:
        b = len(frames)
        x, cond = self._inputs(frames, actions)
        if self.config.latent_dim:
            if z is None:
                z = cond.new_zeros(b, self.config.latent_dim)
            cond = torch.cat([cond, z.to(cond.dtype)], 1)
        elif self.config.code_grid:
            g, k = int(self.config.code_grid), int(self.config.code_classes)
            code = x.new_zeros(b, k, g, g) if z is None else z.to(x.dtype)
            x = torch.cat([x, F.interpolate(code, size=x.shape[-2:], mode="nearest")], 1)
        c = self.cond(cond)
        x = self.stem(x)
        skips = []
        for block, pool in zip(self.down, self.pool, strict=True):
            x = block(x, c)
            skips.append(x)
            x = pool(x)
        x = self.mid(x, c)
        for block in self.up:
            skip = skips.pop()
            if x.shape[-1] != skip.shape[-1]:
                x = F.interpolate(x, size=skip.shape[-2:], mode="nearest")
            x = block(torch.cat([x, skip], 1), c)
        logits = self.out(x)
        last = F.one_hot(frames[:, -1], self.config.num_colours).permute(0, 3, 1, 2)
        return logits + self.copy_gain * last.to(logits.dtype)
