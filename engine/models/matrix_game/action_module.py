"""Matrix-Game's action module: keyboard and mouse injected into the tokens of a transformer
block, after its cross-attention and before its feed-forward (written from the published
code and report; parameter names as in the published checkpoints).

Mouse: each spatial token, frame by frame, concatenates the latent frame's window of raw
mouse motion (12 frames x (pitch, yaw)) to its features, goes through an MLP, and attends
over time to the same token's earlier frames (its own chunk's and the local window's); the
result is projected back and added. Keyboard: each raw frame's keys are embedded, a latent
frame's window of 12 embeddings is one key/value per frame, and every token attends over the
frames of the window to them; projected and added. Both attentions carry RoPE on the latent
frame's absolute index (only the first ``rope_dim_list[0]`` channels of a head rotate: a
token has one position per frame) and keep their keys/values in the session's paged cache
(``cache.attend_mouse`` / ``cache.attend_keyboard``: block-causal, like the self-attention).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from worldstream.engine.models.matrix_game.config import ActionConfig


def _rms(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    # NOTE: the published module's q/k RMS norms have weights that its forward never reads
    # (they stay at their initial ones); normalising without them is that forward
    return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps).to(x.dtype)


class _UnusedNorm(nn.Module):
    """A q/k norm's weight, kept so checkpoints load (see :func:`_rms`)."""

    def __init__(self, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))


def action_rope(config: ActionConfig, positions: torch.Tensor, frames: int
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE tables of ``frames`` latent frames starting at each row's ``positions`` ``(B,)``:
    ``(cos, sin)``, each ``(B, frames, 1, head_dim)`` float32, interleaved pairs; the channels
    past ``rope_dim_list[0]`` (height, width at position 0) do not rotate."""
    head_dim = config.keyboard_hidden_dim // config.heads_num
    t_dim = config.rope_dim_list[0]
    pos = (positions.to(torch.float64)[:, None] + torch.arange(frames, dtype=torch.float64))
    freqs = config.rope_theta ** (-torch.arange(0, t_dim, 2, dtype=torch.float64) / t_dim)
    angles = (pos[..., None] * freqs).repeat_interleave(2, -1)  # (B, frames, t_dim)
    pad = torch.zeros(*angles.shape[:2], head_dim - t_dim, dtype=torch.float64)
    angles = torch.cat([angles, pad], -1)[:, :, None]
    return angles.cos().float(), angles.sin().float()


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the pairs ``(x[2i], x[2i+1])`` of ``x`` ``(..., L, H, D)`` by the angles whose
    ``cos``/``sin`` broadcast to it; float32 inside, ``x.dtype`` out."""
    a, b = x.float().unflatten(-1, (-1, 2)).unbind(-1)
    turned = torch.stack([-b, a], -1).flatten(-2)
    return (x.float() * cos + turned * sin).type_as(x)


class MatrixGameActionModule(nn.Module):
    """The action module of one block.

    Args:
        config: the model's :class:`ActionConfig`.
        layer: this module's index among the blocks with one (its place in the action cache).
    """

    def __init__(self, config: ActionConfig, layer: int):
        super().__init__()
        c, w = config, config.window
        self.config, self.layer = c, layer
        self.heads = c.heads_num
        # 1. keyboard: a raw frame's keys -> an embedding; a window of them -> keys/values
        if c.enable_keyboard:
            self.keyboard_embed = nn.Sequential(nn.Linear(c.keyboard_dim_in, c.hidden_size),
                                                nn.SiLU(), nn.Linear(c.hidden_size,
                                                                     c.hidden_size))
            head = c.keyboard_hidden_dim // c.heads_num
            self.key_attn_q_norm, self.key_attn_k_norm = _UnusedNorm(head), _UnusedNorm(head)
            self.mouse_attn_q = nn.Linear(c.img_hidden_size, c.keyboard_hidden_dim,
                                          bias=c.qkv_bias)
            self.keyboard_attn_kv = nn.Linear(c.hidden_size * w, 2 * c.keyboard_hidden_dim,
                                              bias=c.qkv_bias)
            self.proj_keyboard = nn.Linear(c.keyboard_hidden_dim, c.img_hidden_size,
                                           bias=c.qkv_bias)
        # 2. mouse: token features + a window of raw motion -> temporal self-attention
        if c.enable_mouse:
            h = c.mouse_hidden_dim
            self.mouse_mlp = nn.Sequential(
                nn.Linear(c.mouse_dim_in * w + c.img_hidden_size, h),
                nn.GELU(approximate="tanh"), nn.Linear(h, h), nn.LayerNorm(h))
            self.t_qkv = nn.Linear(h, 3 * h, bias=c.qkv_bias)
            head = h // c.heads_num
            self.img_attn_q_norm, self.img_attn_k_norm = _UnusedNorm(head), _UnusedNorm(head)
            self.proj_mouse = nn.Linear(h, c.img_hidden_size, bias=c.qkv_bias)

    def forward(self, x: torch.Tensor, frames: int, mouse: torch.Tensor | None,
                keyboard: torch.Tensor | None, rope: tuple[torch.Tensor, torch.Tensor],
                cache: Any) -> torch.Tensor:
        """Add the actions to the tokens of a chunk.

        Args:
            x: ``(B, frames * S, dim)`` tokens, frame-major.
            frames: latent frames of the chunk.
            mouse: ``(B, frames, window * 2)`` each latent frame's raw mouse window (frame by
                frame: pitch, yaw), or None for a model without the mouse branch.
            keyboard: ``(B, frames, window, keyboard_dim)`` each latent frame's raw keys.
            rope: :func:`action_rope` of the chunk's frames.
            cache: writes this chunk's action keys/values and attends the session's pages:
                ``attend_mouse(q, k, v, layer)`` with ``(B, S, frames, H, D)`` tensors and
                ``attend_keyboard(q, k, v, layer)`` with q ``(B, S, frames, H, D)``, k/v
                ``(B, frames, H, D)``; both return ``(B, S, frames, H, D)``.
        Returns:
            ``(B, frames * S, dim)``, ``x``'s dtype.
        """
        b, n, dim = x.shape
        s = n // frames
        cos, sin = rope[0][:, None], rope[1][:, None]  # (B, 1, frames, 1, D)
        if self.config.enable_mouse and mouse is not None:
            tokens = x.view(b, frames, s, dim).transpose(1, 2)  # (B, S, frames, dim)
            motion = mouse[:, None].to(x.dtype).expand(b, s, frames, mouse.shape[-1])
            h = self.mouse_mlp(torch.cat([tokens, motion], -1))
            q, k, v = self.t_qkv(h).unflatten(-1, (3, self.heads, -1)).unbind(-3)
            q, k = _rotate(_rms(q), cos, sin), _rotate(_rms(k), cos, sin)
            out = cache.attend_mouse(q, k, v, self.layer)  # (B, S, frames, H, D)
            out = self.proj_mouse(out.flatten(-2).to(x.dtype)).transpose(1, 2)
            x = x + out.reshape(b, n, dim)
        if self.config.enable_keyboard and keyboard is not None:
            emb = self.keyboard_embed(keyboard.to(x.dtype)).flatten(2)  # (B, frames, w*hidden)
            k, v = self.keyboard_attn_kv(emb).unflatten(-1, (2, self.heads, -1)).unbind(-3)
            q = self.mouse_attn_q(x).view(b, frames, s, self.heads, -1).transpose(1, 2)
            q = _rotate(_rms(q), cos, sin)
            k = _rotate(_rms(k), rope[0], rope[1])
            out = cache.attend_keyboard(q, k, v, self.layer)  # (B, S, frames, H, D)
            out = self.proj_keyboard(out.flatten(-2).to(x.dtype)).transpose(1, 2)
            x = x + out.reshape(b, n, dim)
        return x
