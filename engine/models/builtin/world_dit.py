"""The built-in world model: a small causal diffusion transformer over autoencoder latents.

Tokens are 4×4 latent patches (a 32×32 latent frame -> 8×8 = 64 tokens). Each frame is
conditioned (adaLN-Zero, DiT) on its noise level σ, its action and the scene-prompt embedding;
the action is also added to every token of its frame (a strong per-token signal). Positions:
learned over the 8×8 grid, rotary (RoPE) over time, so cached keys stay valid as the stream
moves on. Attention goes through ``engine.models.builtin.attention.attend`` (one call site): dense
block-causal for training, paged KV cache in the engine. The network predicts the clean latent
x0 (velocity prediction does not train well at this width).

Spatial memory. Every frame is fed a *base*: the window of the stream's spatial memory
(``engine.models.builtin.spatial_memory``) at the frame's camera position, encoded by the
autoencoder, with two planes saying where memory holds content of the current prompt (*current*)
and of an earlier one (*stale*, to restyle). The output is residual on that base, so the
transformer generates only what memory cannot explain. The camera position comes from a learned
camera dynamics model (``engine.models.builtin.camera_dynamics``): the model decides where the
view moves, the memory makes sure what was seen stays where it was.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from diffusers.configuration_utils import ConfigMixin, FrozenDict, register_to_config
from diffusers.models.modeling_utils import ModelMixin
from torch import nn

from worldstream.engine.models.builtin.attention import AttentionContext, attend
from worldstream.engine.models.builtin.camera_dynamics import CameraDynamics


def _timestep_embedding(sigma: torch.Tensor, dim: int) -> torch.Tensor:
    """Sinusoidal embedding of σ·1000: ``(...)`` -> ``(..., dim)`` float32."""
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, device=sigma.device) / half)
    args = sigma.float()[..., None] * 1000.0 * freqs
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


def _rope_cos_sin(positions: torch.Tensor, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables ``(B, 1, L, head_dim)`` for integer positions ``(B, L)``; angles in float64
    so that large stream positions keep full precision."""
    half = head_dim // 2
    inv = 1.0 / (
        10000.0 ** (torch.arange(half, device=positions.device, dtype=torch.float64) / half)
    )
    ang = positions.to(torch.float64)[..., None] * inv
    ang = torch.cat([ang, ang], dim=-1)[:, None]
    return ang.cos().float(), ang.sin().float()


def _apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return (x * cos + torch.cat([-x2, x1], dim=-1) * sin).to(x.dtype)


class WorldDiTActionEmbedding(nn.Module):
    """Embedding of a factored action id: ``id = a_0 + f_0 * (a_1 + f_1 * (a_2 + ...))`` with
    factor sizes ``factors``; the sum of one embedding table per factor. A world whose frame
    carries several independent controls (the avatar: head direction, expression, viseme)
    learns each from every frame it occurs in, instead of one row per combination."""

    def __init__(self, factors: tuple[int, ...], dim: int):
        super().__init__()
        self.factors = tuple(int(f) for f in factors)
        self.tables = nn.ModuleList(nn.Embedding(f, dim) for f in self.factors)

    def forward(self, actions: torch.Tensor) -> torch.Tensor:
        """``(...)`` int64 ids -> ``(..., dim)``."""
        out, rest = 0, actions
        for f, table in zip(self.factors, self.tables):
            out = out + table(rest % f)
            rest = rest // f
        return out


#: a model's second skip sources (``WorldDiT``'s ``skip_source``)
SKIP_SOURCES = (None, "warped")

#: the last commit whose code trained and ran the retired config keys below
RETIRED_AT = "60fcd8b"
#: config keys of experiments that did not ship, each with the only value still accepted (a
#: saved config holding it loads, the key dropped; any other value is refused)
RETIRED_KEYS = {"base_warp": None, "noise_correlation": 0.0, "noise_scale": 2.0,
                "skip_floor": None, "backdrop_fill": False}


class WorldDiTConfig(FrozenDict):
    """A :class:`WorldDiT`'s config: diffusers' frozen dict, with the retired keys readable as
    attributes at their fixed values (``RETIRED_KEYS``) for code that still reads them."""


for _key, _value in RETIRED_KEYS.items():
    setattr(WorldDiTConfig, _key, _value)


def drop_retired_keys(config: dict) -> dict:
    """``config`` (a saved :class:`WorldDiT` config dict) without the retired keys, each of
    which must hold its only accepted value; ValueError naming the key and ``RETIRED_AT``
    otherwise, or for ``skip_source`` ``"previous"``."""
    for key, value in config.items():
        if key in RETIRED_KEYS and value != RETIRED_KEYS[key]:
            raise ValueError(f"WorldDiT config {key}={value!r} is a retired experiment (only "
                             f"{RETIRED_KEYS[key]!r} loads); commit {RETIRED_AT} runs it")
    if config.get("skip_source") == "previous":
        raise ValueError("WorldDiT config skip_source='previous' is a retired experiment; "
                         f"commit {RETIRED_AT} runs it")
    return {k: v for k, v in config.items() if k not in RETIRED_KEYS}


class WorldDiTPoseEmbedding(nn.Module):
    """A rig's continuous pose ``(..., 2)`` (yaw, pitch in [-1, 1]) -> ``(token, frame)``
    vectors ``(..., dim)`` each: Fourier features (the pose and sin/cos of it at 4 octaves, as
    NeRF encodes positions) through an MLP, two zero-initialised outputs (added to every token
    of the frame, and to its adaLN conditioning, as the action is)."""

    OCTAVES = 4

    def __init__(self, dim: int):
        super().__init__()
        width = 2 + 4 * self.OCTAVES
        self.mlp = nn.Sequential(nn.Linear(width, dim), nn.SiLU())
        self.token, self.frame = nn.Linear(dim, dim), nn.Linear(dim, dim)
        for layer in (self.token, self.frame):
            nn.init.zeros_(layer.weight)
            nn.init.zeros_(layer.bias)

    def forward(self, pose: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = math.pi * 2.0 ** torch.arange(self.OCTAVES, device=pose.device)
        ang = (pose[..., None] * freqs.to(pose.dtype)).flatten(-2)
        h = self.mlp(torch.cat([pose, torch.sin(ang), torch.cos(ang)], dim=-1))
        return self.token(h), self.frame(h)


class WorldDiTBlock(nn.Module):
    """Pre-norm transformer block with adaLN-Zero modulation and QK-RMSNorm."""

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float):
        super().__init__()
        self.num_heads = num_heads
        self.norm1 = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.q_norm = nn.RMSNorm(dim // num_heads, eps=1e-6)
        self.k_norm = nn.RMSNorm(dim // num_heads, eps=1e-6)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        hidden = int(dim * mlp_ratio)
        self.mlp = nn.Sequential(
            nn.Linear(dim, hidden), nn.GELU(approximate="tanh"), nn.Linear(hidden, dim)
        )
        self.ada = nn.Linear(dim, 6 * dim)
        nn.init.zeros_(self.ada.weight)
        nn.init.zeros_(self.ada.bias)

    def forward(self, x, cond, rope, layer: int, ctx: AttentionContext):
        """``x``: ``(B, T, n, d)`` tokens of T frames; ``cond``: ``(B, T, 1, d)`` per frame (the
        modulation is computed once per frame and broadcast over its n tokens)."""
        b, t, n, d = x.shape
        shift1, scale1, gate1, shift2, scale2, gate2 = self.ada(cond).chunk(6, dim=-1)
        h = self.norm1(x) * (1 + scale1) + shift1
        qkv = self.qkv(h).view(b, t * n, 3, self.num_heads, d // self.num_heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)
        q, k = self.q_norm(q), self.k_norm(k)
        q, k = _apply_rope(q, *rope), _apply_rope(k, *rope)
        a = attend(q, k.to(q.dtype), v.to(q.dtype), layer, ctx)
        x = x + gate1 * self.proj(a.transpose(1, 2).reshape(b, t, n, d))
        h = self.norm2(x) * (1 + scale2) + shift2
        return x + gate2 * self.mlp(h)


class WorldDiT(ModelMixin, ConfigMixin):
    """Causal world transformer with a spatial-memory base and learned camera dynamics.

    Config:
        latent_channels: autoencoder latent channels (4).
        latent_size: latent frame side, latent px (32).
        patch_size: token side, latent px (4: 8 × 8 tokens a frame).
        dim, depth, num_heads, mlp_ratio: transformer width, blocks, heads, MLP ratio.
        num_actions: action ids (9 for the landscape).
        text_dim: scene-prompt embedding width (384).
        chunk_frames: frames a chunk, as trained (the engine reads it).
        latent_mean, latent_std: per-channel latent statistics; the model sees
            ``(z - mean) / std``.
        image_size: frame side, px.
        view_box: side (px) of the centre square never written to memory (0 = none).
        action_factors: None (plain ids) or the factor sizes an id is made of, product
            ``num_actions`` (:class:`WorldDiTActionEmbedding`).
        skip_source: None, or ``"warped"``: a second picture beside the base, the memory
            picture moved to the frame's pose by the ``pose_path`` rig; the skip becomes
            ``base + m · (source − base)`` with ``m`` a predicted per-pixel map (zero at start).
        pose_path: None, or the name in ``engine.worlds.catalog.BASE_WARPS`` of the rig whose
            pose (yaw, pitch in [-1, 1]) conditions every frame.
        skip_prior: offset added to the predicted map (1.0 starts trusting the source).

    Why ``skip_source``: the base reaches the output through a direct skip, the frames before
    only through attention over 16-px patches; for a still camera (the avatar) a turned head
    had to be redrawn by the residual over the head at rest. With the warped picture in the
    skip its detail comes through directly where the rig is right (a gated skip, as in highway
    networks). Why ``pose_path``: a model reading the pose from its context did not know how
    far along a turn a frame is. Saved configs with retired keys load when those hold their
    only accepted value (:func:`drop_retired_keys`).
    """

    def normalize(self, z: torch.Tensor) -> torch.Tensor:
        """Autoencoder latents ``(..., C, h, w)`` -> model space (per-channel standardised)."""
        mean, std = self._stats(z)
        return (z - mean) / std

    def denormalize(self, z: torch.Tensor) -> torch.Tensor:
        mean, std = self._stats(z)
        return z * std + mean

    def _stats(self, z: torch.Tensor):
        c = self.config.latent_channels
        mean = torch.tensor(self.config.latent_mean or [0.0] * c, device=z.device)
        std = torch.tensor(self.config.latent_std or [1.0] * c, device=z.device)
        return mean[:, None, None], std[:, None, None]

    @register_to_config
    def __init__(
        self,
        latent_channels: int = 4,
        latent_size: int = 32,
        patch_size: int = 4,
        dim: int = 128,
        depth: int = 6,
        num_heads: int = 4,
        mlp_ratio: float = 3.0,
        num_actions: int = 9,
        text_dim: int = 384,
        chunk_frames: int = 1,
        latent_mean: tuple[float, ...] | None = None,
        latent_std: tuple[float, ...] | None = None,
        image_size: int = 128,
        view_box: int = 13,
        action_factors: tuple[int, ...] | None = None,
        skip_source: str | None = None,
        pose_path: str | None = None,
        skip_prior: float = 0.0,
    ):
        super().__init__()
        if skip_source not in SKIP_SOURCES:
            raise ValueError(f"skip_source must be one of {SKIP_SOURCES}, got {skip_source!r}")
        if skip_source == "warped" and pose_path is None:
            raise ValueError("skip_source 'warped' warps to a rig's pose: give pose_path")
        grid = latent_size // patch_size
        self.tokens_per_frame = grid * grid
        # 1. patch stem over [noisy latent ; base ; base σ, current, stale planes (; second
        #    skip source)] (overlapping 2p × 2p patches)
        self.stem = nn.Conv2d(
            (3 if skip_source else 2) * latent_channels + 3,
            dim,
            kernel_size=2 * patch_size,
            stride=patch_size,
            padding=patch_size // 2,
        )
        self.pos = nn.Parameter(torch.randn(1, self.tokens_per_frame, dim) * 0.02)
        # 2. per-frame conditioning: noise level + action + scene prompt
        self.sigma_mlp = nn.Sequential(nn.Linear(dim, dim), nn.SiLU(), nn.Linear(dim, dim))
        if action_factors is None:
            self.action_emb = nn.Embedding(num_actions, dim)
            self.action_tok = nn.Embedding(num_actions, dim)
        else:
            if math.prod(action_factors) != num_actions:
                raise ValueError(f"action_factors {tuple(action_factors)} must multiply to "
                                 f"num_actions ({num_actions})")
            self.action_emb = WorldDiTActionEmbedding(action_factors, dim)
            self.action_tok = WorldDiTActionEmbedding(action_factors, dim)
        self.text_proj = nn.Sequential(nn.Linear(text_dim, dim), nn.SiLU(), nn.Linear(dim, dim))
        if pose_path is not None:  # zero at start: a warm-started model begins unchanged
            self.pose_emb = WorldDiTPoseEmbedding(dim)
        # 3. transformer blocks
        self.blocks = nn.ModuleList(WorldDiTBlock(dim, num_heads, mlp_ratio) for _ in range(depth))
        # 4. output: adaLN + linear back to patches
        self.norm_out = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.ada_out = nn.Linear(dim, 2 * dim)
        self.out = nn.Linear(dim, patch_size * patch_size * latent_channels)
        nn.init.zeros_(self.ada_out.weight)
        nn.init.zeros_(self.ada_out.bias)
        if skip_source:  # the skip's mixing map, one value per latent pixel, zero at start
            self.skip_gate = nn.Linear(dim, patch_size * patch_size)
            nn.init.zeros_(self.skip_gate.weight)
            nn.init.zeros_(self.skip_gate.bias)
        # 5. where the camera goes: velocity from the previous velocity and the action
        self.camera = CameraDynamics(num_actions)

    @classmethod
    def extract_init_dict(cls, config_dict, **kwargs):
        return super().extract_init_dict(drop_retired_keys(dict(config_dict)), **kwargs)

    # NOTE: defined after __init__, whose decorator is diffusers' register_to_config
    def register_to_config(self, **kwargs):
        super().register_to_config(**kwargs)
        self._internal_dict = WorldDiTConfig(self._internal_dict)

    def forward(
        self,
        latents: torch.Tensor,
        base: torch.Tensor,
        base_sigma: torch.Tensor,
        known: torch.Tensor,
        sigma: torch.Tensor,
        actions: torch.Tensor,
        text: torch.Tensor,
        positions: torch.Tensor,
        ctx: AttentionContext,
        skip: torch.Tensor | None = None,
        pose: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Predict clean latents.

        Args:
            latents: ``(B, T, C, h, w)`` noisy latents of T frames (any float dtype).
            base: ``(B, T, C, h, w)`` each frame's memory window, encoded and normalised
                (unknown pixels read as mid-grey).
            base_sigma: ``(B, T)`` noise level the base is tagged with (context noise).
            known: ``(B, T, 2, h, w)`` fraction of each latent pixel's image pixels that memory
                holds from the current prompt (channel 0) and from an earlier one (channel 1).
            sigma: ``(B, T)`` flow-matching noise level in [0, 1] of each frame.
            actions: ``(B, T)`` int64 action ids (``engine.worlds.actions``).
            text: ``(B, T, text_dim)`` scene-prompt embedding per frame (zeros = no prompt).
            positions: ``(B, T)`` int64 absolute frame indices (rotary time positions).
            ctx: attention context (dense mask or paged KV cache), see
            ``engine.models.builtin.attention``.
            skip: ``(B, T, C, h, w)`` normalised latent of each frame's second skip source
                (``skip_source``: the memory picture warped to its pose), noised at
                ``base_sigma`` as the base is; required by a model with ``skip_source``,
                refused otherwise (ValueError).
            pose: ``(B, T, 2)`` float32 the rig's pose (yaw, pitch in [-1, 1]) at each frame,
                for a model with ``pose_path`` (required there, refused otherwise:
                ValueError).
        Returns:
            ``(B, T, C, h, w)`` float32 predicted x0: the skip (the base, with ``skip_source``
            mixed per pixel with ``skip`` by the predicted map; scaled by its clean fraction)
            plus the network's output.
        """
        cfg = self.config
        b, t, c, hh, ww = latents.shape
        n = self.tokens_per_frame
        # 1. patch stem
        dt = base.dtype
        plane = base_sigma.to(dt)[..., None, None, None].expand(b, t, 1, hh, ww)
        if (skip is not None) != bool(cfg.skip_source):
            raise ValueError(f"this model {'needs' if cfg.skip_source else 'takes no'} a "
                             "second skip source (skip)")
        parts = [latents.to(dt), base, plane, known.to(dt)]
        if skip is not None:
            parts.append(skip.to(dt))
        if (pose is not None) != (cfg.pose_path is not None):
            raise ValueError(f"this model {'needs' if cfg.pose_path else 'takes no'} the "
                             "rig's pose (pose)")
        x = torch.cat(parts, dim=2)
        x = x.reshape(b * t, x.shape[2], hh, ww)
        x = self.stem(x.to(self.stem.weight.dtype)).flatten(2).transpose(1, 2)  # (B*T, n, dim)
        x = x + self.pos + self.action_tok(actions).reshape(b * t, 1, -1)
        x = x.reshape(b, t, n, -1)
        # 2. conditioning, one vector per frame, broadcast over its tokens
        dtype = self.pos.dtype  # fp32 or bf16 weights (autocast or a cast model)
        cond = (
            self.sigma_mlp(_timestep_embedding(sigma, cfg.dim).to(dtype))
            + self.action_emb(actions)
            + self.text_proj(text.to(dtype))
        )
        if pose is not None:
            token, frame = self.pose_emb(pose.to(dtype))
            x = x + token[:, :, None].to(x.dtype)
            cond = cond + frame
        cond = F.silu(cond)[:, :, None]  # (B, T, 1, dim)
        rope = _rope_cos_sin(positions.repeat_interleave(n, dim=1), cfg.dim // cfg.num_heads)
        # 3. blocks
        for layer, block in enumerate(self.blocks):
            x = block(x, cond, rope, layer, ctx)
        # 4. output, residual on the base
        h = self.norm_out(x)
        shift, scale = self.ada_out(cond).chunk(2, dim=-1)
        h = h * (1 + scale) + shift
        x = self._unpatchify(self.out(h).float(), c)  # (B, T, C, h, w)
        through = base.float()
        if skip is not None:
            mix = cfg.skip_prior + self._unpatchify(self.skip_gate(h).float(), 1)  # (B,T,1,h,w)
            through = through + mix * (skip.float() - through)
        return x + (1 - base_sigma.float())[..., None, None, None] * through

    def _unpatchify(self, x: torch.Tensor, channels: int) -> torch.Tensor:
        """``(B, T, n, p*p*channels)`` per-token outputs -> ``(B, T, channels, h, w)``."""
        b, t = x.shape[:2]
        p = self.config.patch_size
        g = self.config.latent_size // p
        x = x.reshape(b, t, g, g, p, p, channels).permute(0, 1, 6, 2, 4, 3, 5)
        return x.reshape(b, t, channels, g * p, g * p)
