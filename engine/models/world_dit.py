"""The built-in world model: a small causal diffusion transformer over autoencoder latents.

Tokens are 2×2 latent patches (a 16×16 latent frame -> 8×8 = 64 tokens). Each frame is
conditioned (adaLN-Zero, DiT) on its noise level σ, its action and the scene-prompt embedding;
the action is also added to every token of its frame (a strong per-token signal), and the
previous clean frame is fed into each token through the patch stem (DIAMOND/GameNGen-style frame
conditioning). Positions: learned over the 8×8 grid, rotary (RoPE) over time, so cached keys stay
valid as the stream moves on. Attention goes through ``engine.models.attention.attend`` (one call
site): dense block-causal for training, paged KV cache in the engine. The network predicts the
clean latent x0 (velocity prediction failed at this width; see DESIGN.md).

With ``motion_warp`` the model also predicts, per frame, the camera's displacement since the
previous frame (a global translation in latent pixels, pooled from the frame's output tokens)
and its residual base is the previous frame *shifted* by it (bilinear ``grid_sample``) rather
than the previous frame itself: motion-compensated prediction as in video codecs and
flow-based frame synthesis (Liu et al. 2017, "Video Frame Synthesis using Deep Voxel Flow";
Reda et al. 2018, "SDC-Net"). The transformer then only generates what the shift cannot
explain: revealed terrain at the border, animated elements, scene changes. Without it, the
network has to synthesise sub-patch shifts pixel by pixel and learned to copy the last frame.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.models.modeling_utils import ModelMixin
from torch import nn

from engine.models.attention import AttentionContext, attend


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


def shift_frames(frames: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """Translate frames by a sub-pixel displacement: ``out(u) = frames(u + shift)``.

    Args:
        frames: ``(N, C, h, w)`` float32.
        shift: ``(N, 2)`` float32 displacement ``(x, y)`` in pixels of ``frames``; a camera
            moving right by one pixel (``x = +1``) moves the content one pixel left.
    Returns ``(N, C, h, w)``: bilinear samples (``torch.nn.functional.grid_sample``); where the
    shift reveals content outside the frame, the frame is mirrored at its edge. Mirroring fills
    the revealed strip with terrain-like texture, the same one-step error as repeating the edge
    pixels but without the edge smears that a free rollout piles up into streaks.
    """
    n, _, h, w = frames.shape
    ys, xs = torch.meshgrid(
        torch.arange(h, device=frames.device, dtype=frames.dtype),
        torch.arange(w, device=frames.device, dtype=frames.dtype),
        indexing="ij",
    )
    # pixel -> normalised [-1, 1] coordinates of align_corners=False
    gx = (2 * (xs + shift[:, 0, None, None]) + 1) / w - 1
    gy = (2 * (ys + shift[:, 1, None, None]) + 1) / h - 1
    grid = torch.stack([gx, gy], dim=-1)
    return F.grid_sample(
        frames, grid, mode="bilinear", padding_mode="reflection", align_corners=False
    )


def _apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return (x * cos + torch.cat([-x2, x1], dim=-1) * sin).to(x.dtype)


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
    """Causal world transformer.

    Args (config): ``latent_channels`` (8), ``latent_size`` (16), ``patch_size`` (2), ``dim``,
    ``depth``, ``num_heads``, ``mlp_ratio``, ``num_actions`` (9), ``text_dim`` (384),
    ``chunk_frames`` (frames per chunk it was trained with), ``latent_mean``/``latent_std``
    (per-channel autoencoder latent statistics; the model sees normalised latents),
    ``residual`` (the output is added to the previous frame, scaled by its clean fraction),
    ``motion_warp`` (with ``residual``: the previous frame is first shifted by the predicted
    camera displacement, see the module docstring).
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
        latent_channels: int = 8,
        latent_size: int = 16,
        patch_size: int = 2,
        dim: int = 192,
        depth: int = 6,
        num_heads: int = 6,
        mlp_ratio: float = 3.0,
        num_actions: int = 9,
        text_dim: int = 384,
        chunk_frames: int = 2,
        latent_mean: tuple[float, ...] | None = None,
        latent_std: tuple[float, ...] | None = None,
        residual: bool = False,
        motion_warp: bool = False,
    ):
        # residual: predict x0 as (1 - σ_prev)·prev + output, so an untrained network starts
        # from "copy the previous frame" and learns the motion on top of it;
        # chunk_frames, latent_mean/std: how the model was trained (the engine reads them);
        # latents are normalised per channel as (z - mean) / std before entering the model
        super().__init__()
        grid = latent_size // patch_size
        self.tokens_per_frame = grid * grid
        # 1. patch stem over [noisy latent ; previous frame ; previous frame's σ as a plane]
        #    (overlapping 4x4 patches)
        self.stem = nn.Conv2d(
            2 * latent_channels + 1,
            dim,
            kernel_size=2 * patch_size,
            stride=patch_size,
            padding=patch_size // 2,
        )
        self.pos = nn.Parameter(torch.randn(1, self.tokens_per_frame, dim) * 0.02)
        # 2. per-frame conditioning: noise level + action + scene prompt
        self.sigma_mlp = nn.Sequential(nn.Linear(dim, dim), nn.SiLU(), nn.Linear(dim, dim))
        self.action_emb = nn.Embedding(num_actions, dim)
        self.action_tok = nn.Embedding(num_actions, dim)
        self.text_proj = nn.Sequential(nn.Linear(text_dim, dim), nn.SiLU(), nn.Linear(dim, dim))
        # 3. transformer blocks
        self.blocks = nn.ModuleList(WorldDiTBlock(dim, num_heads, mlp_ratio) for _ in range(depth))
        # 4. output: adaLN + linear back to patches
        self.norm_out = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.ada_out = nn.Linear(dim, 2 * dim)
        self.out = nn.Linear(dim, patch_size * patch_size * latent_channels)
        nn.init.zeros_(self.ada_out.weight)
        nn.init.zeros_(self.ada_out.bias)
        # 5. camera displacement per frame (latent px); zero at init = "no motion"
        if motion_warp:
            if not residual:
                raise ValueError("motion_warp shifts the residual base: it needs residual=True")
            self.motion = nn.Sequential(nn.Linear(dim, dim), nn.SiLU(), nn.Linear(dim, 2))
            nn.init.zeros_(self.motion[2].weight)
            nn.init.zeros_(self.motion[2].bias)

    def forward(
        self,
        latents: torch.Tensor,
        prev: torch.Tensor,
        prev_sigma: torch.Tensor,
        sigma: torch.Tensor,
        actions: torch.Tensor,
        text: torch.Tensor,
        positions: torch.Tensor,
        ctx: AttentionContext,
        return_motion: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Predict clean latents.

        Args:
            latents: ``(B, T, C, h, w)`` noisy latents of T frames (any float dtype).
            prev: ``(B, T, C, h, w)`` the previous frame fed to each frame (zeros if none): the
                last frame of the previous chunk, as the model saw it.
            prev_sigma: ``(B, T)`` noise level of ``prev`` (1 when there is none).
            sigma: ``(B, T)`` flow-matching noise level in [0, 1] of each frame.
            actions: ``(B, T)`` int64 action ids (``engine.worlds.actions``).
            text: ``(B, T, text_dim)`` scene-prompt embedding per frame (zeros = no prompt).
            positions: ``(B, T)`` int64 absolute frame indices (rotary time positions).
            ctx: attention context (dense mask or paged KV cache), see ``engine.models.attention``.
            return_motion: also return the predicted camera displacement (training).
        Returns:
            ``(B, T, C, h, w)`` float32 predicted x0; with ``return_motion`` also ``(B, T, 2)``
            float32 displacement ``(x, y)`` of each frame from ``prev`` in latent pixels (zeros
            without ``motion_warp``).
        """
        cfg = self.config
        b, t, c, hh, ww = latents.shape
        n = self.tokens_per_frame
        # 1. patch stem
        plane = prev_sigma.to(prev.dtype)[..., None, None, None].expand(b, t, 1, hh, ww)
        x = torch.cat([latents.to(prev.dtype), prev, plane], dim=2).reshape(
            b * t, 2 * c + 1, hh, ww
        )
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
        cond = F.silu(cond)[:, :, None]  # (B, T, 1, dim)
        rope = _rope_cos_sin(positions.repeat_interleave(n, dim=1), cfg.dim // cfg.num_heads)
        # 3. blocks
        for layer, block in enumerate(self.blocks):
            x = block(x, cond, rope, layer, ctx)
        # 4. output
        h = self.norm_out(x)
        shift, scale = self.ada_out(cond).chunk(2, dim=-1)
        x = self.out(h * (1 + scale) + shift).float()  # (B, T, n, p*p*C)
        p = cfg.patch_size
        g = hh // p
        x = x.reshape(b, t, g, g, p, p, c).permute(0, 1, 6, 2, 4, 3, 5)
        x = x.reshape(b, t, c, hh, ww)
        motion = None
        if cfg.residual:
            base = prev.float()
            if cfg.motion_warp:
                motion = self.motion(h.mean(dim=2)).float()
                base = shift_frames(base.reshape(b * t, c, hh, ww), motion.reshape(b * t, 2))
                base = base.reshape(b, t, c, hh, ww)
            x = x + (1 - prev_sigma.float())[..., None, None, None] * base
        if not return_motion:
            return x
        return x, torch.zeros(b, t, 2, device=x.device) if motion is None else motion
