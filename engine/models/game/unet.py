"""``GameUNet``: the next frame's palette logits from the last frames and actions.

Context frames enter as learned colour embeddings stacked on channels (DIAMOND stacks its 4
context frames the same way); the actions of the context and of the predicted frame condition
every residual block through adaptive group norm (a scale and shift per channel). The logits
start from the last frame copied (a learned gain on its one-hot), so the network spends its
capacity on what changes.

With ``code_tokens > 0`` a discrete *outcome code* joins the actions in that conditioning:
``code_tokens`` categorical tokens of ``code_classes`` values per frame (SimPLe's bits, Δ-IRIS's
delta tokens). In training ``posterior`` reads it off the true next frame (straight-through
argmax), so what the frames and actions leave open (a serve's moment and place, an enemy's
step) is carried by the code instead of pulling every pixel towards "nothing happens"; the
prior ``code_prior`` learns by cross-entropy to predict that code from the context and actions,
and play *samples* one code per frame from it and carries it out, sharp. An all-zero code (no
token) is the dropped code training also shows, so the network still learns what the actions
alone decide.

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


class CodePrior(nn.Module):
    """``p(code | context frames, actions)``, autoregressive over the code's tokens: token
    ``i``'s logits read the context's features and tokens ``0 .. i-1`` (one-hot), so a sampled
    code is one consistent outcome, not tokens drawn apart.

    ``features(frames, actions)``: frames ``(B, context, H, W)`` long, actions ``(B, context)``
    long -> ``(B, width)``. ``logits(h, codes)``: teacher-forced ``(B, tokens, classes)`` float
    logits given the true codes ``(B, tokens)`` long. ``sample(h, u)``: codes ``(B, tokens)``
    long drawn by inverse CDF from ``u`` ``(B, tokens)`` uniforms in [0, 1) (None: each token's
    most likely value), so a draw is a function of its inputs (exact replay).
    """

    def __init__(self, num_colours: int, num_actions: int, context: int, tokens: int,
                 classes: int, size: int, width: int = 256):
        super().__init__()
        self.tokens, self.classes = tokens, classes
        self.colour = nn.Embedding(num_colours, 8)
        self.action = nn.Embedding(num_actions, 16)
        self.frames = _frame_encoder(8 * context, size, width)
        self.mix = nn.Sequential(nn.SiLU(), nn.Linear(width + 16 * context, width), nn.SiLU())
        self.heads = nn.ModuleList(nn.Linear(width + i * classes, classes)
                                   for i in range(tokens))

    def features(self, frames: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        b, t, h, w = frames.shape
        x = self.colour(frames).permute(0, 1, 4, 2, 3).reshape(b, -1, h, w)
        return self.mix(torch.cat([self.frames(x), self.action(actions).reshape(b, -1)], 1))

    def _head(self, i: int, h: torch.Tensor, before: torch.Tensor) -> torch.Tensor:
        if i:
            onehot = F.one_hot(before[:, :i], self.classes).to(h.dtype).reshape(len(h), -1)
            h = torch.cat([h, onehot], 1)
        return self.heads[i](h).float()

    def logits(self, h: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
        return torch.stack([self._head(i, h, codes) for i in range(self.tokens)], 1)

    def sample(self, h: torch.Tensor, u: torch.Tensor | None) -> torch.Tensor:
        codes = torch.zeros(len(h), self.tokens, dtype=torch.long, device=h.device)
        for i in range(self.tokens):
            logits = self._head(i, h, codes)
            if u is None:
                codes[:, i] = logits.argmax(1)
                continue
            cdf = logits.softmax(1).cumsum(1)
            pick = (cdf < u[:, i:i + 1].to(cdf)).sum(1)
            codes[:, i] = pick.clamp(max=self.classes - 1)
        return codes


class GameUNet(ModelMixin, ConfigMixin):
    """Args (saved in ``config.json``):
        num_colours: palette size K. num_actions: the env's action count.
        context: context frames (and context actions). channels: widths per resolution
        (each level halves the frame). colour_dim: embedding width of a palette colour.
        action_dim: embedding width of an action. latent_dim: width of the older continuous
        latent ``z`` (0: none). size: frame size (pixels). code_tokens, code_classes: the
        outcome code's tokens per frame and values per token (0: no code).
    ``forward(frames, actions, z=None) -> logits``: frames ``(B, context, H, W)`` long palette
    indices (oldest first), actions ``(B, context)`` long (the action after each context
    frame; the last one leads to the predicted frame), ``z`` the frame's outcome code as
    ``(B, code_tokens * code_classes)`` float one-hots (or the continuous ``(B, latent_dim)``;
    None: zeros, the dropped code) -> ``(B, K, H, W)`` float logits.
    ``posterior(next_frame, last_frame)``: training's code logits ``(B, code_tokens,
    code_classes)`` float (or the continuous latent's ``(mu, logvar)``) from two ``(B, H, W)``
    long frames. ``code_prior``: the :class:`CodePrior` play samples codes from.
    """

    @register_to_config
    def __init__(self, num_colours: int = 16, num_actions: int = 4, context: int = 4,
                 channels: tuple[int, ...] = (32, 64, 96), colour_dim: int = 8,
                 action_dim: int = 32, size: int = 64, latent_dim: int = 0,
                 code_tokens: int = 0, code_classes: int = 16):
        super().__init__()
        if latent_dim and code_tokens:
            raise ValueError("a network has the continuous latent or the outcome code, not both")
        self.colour = nn.Embedding(num_colours, colour_dim)
        self.action = nn.Embedding(num_actions, action_dim)
        cond = 2 * action_dim
        extra = latent_dim + code_tokens * code_classes
        self.cond = nn.Sequential(nn.Linear(context * action_dim + extra, cond), nn.SiLU(),
                                  nn.Linear(cond, cond))
        self.stem = nn.Conv2d(context * colour_dim, channels[0], 3, padding=1)
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
        self.code_posterior = (_frame_encoder(2 * colour_dim, size, code_tokens * code_classes)
                               if code_tokens else None)
        self.code_prior = (CodePrior(num_colours, num_actions, context, code_tokens,
                                     code_classes, size) if code_tokens else None)

    @property
    def code_width(self) -> int:
        """Width of the conditioning's code part: ``code_tokens * code_classes`` (0: none)."""
        return int(self.config.code_tokens) * int(self.config.code_classes)

    @classmethod
    def extract_init_dict(cls, config_dict: dict, **kwargs):
        # diffusers would only warn about a retired key and build the network without it
        return super().extract_init_dict(drop_retired(config_dict), **kwargs)

    def posterior(self, next_frame: torch.Tensor, last_frame: torch.Tensor) -> Any:
        pair = torch.cat([self.colour(next_frame), self.colour(last_frame)], -1)
        pair = pair.permute(0, 3, 1, 2)
        if self.code_posterior is not None:
            cfg = self.config
            return self.code_posterior(pair).float().view(-1, cfg.code_tokens, cfg.code_classes)
        if self.posterior_net is None:
            raise ValueError("this network has no latent (latent_dim=0) and no code")
        return self.posterior_net(pair)

    def code_onehot(self, codes: torch.Tensor) -> torch.Tensor:
        """``(B, code_tokens)`` long codes -> ``(B, code_width)`` float one-hots, the code
        ``forward`` reads."""
        return F.one_hot(codes, self.config.code_classes).float().reshape(len(codes), -1)

    def _inputs(self, frames: torch.Tensor,
                actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        b, t, h, w = frames.shape
        x = self.colour(frames).permute(0, 1, 4, 2, 3).reshape(b, -1, h, w)
        return x, self.action(actions).reshape(b, -1)

    def forward(self, frames: torch.Tensor, actions: torch.Tensor,
                z: torch.Tensor | None = None) -> torch.Tensor:
        b = len(frames)
        x, cond = self._inputs(frames, actions)
        extra = self.config.latent_dim or self.code_width
        if extra:
            if z is None:
                z = cond.new_zeros(b, extra)
            cond = torch.cat([cond, z.to(cond.dtype)], 1)
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
