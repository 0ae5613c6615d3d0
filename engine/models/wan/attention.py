"""Self-attention (``attn1``) of diffusers' ``WanTransformer3DModel`` through the paged KV cache.

:func:`install_paged_attention` swaps every block's ``attn1`` processor (``set_attn_processor``)
for a :class:`WanPagedAttnProcessor`; cross-attention (``attn2``) keeps diffusers' own
``WanAttnProcessor``. A processor projects q/k/v exactly like diffusers (RMS norm across heads,
interleaved-pair RoPE), then hands them to the context bound for the current forward (an
``engine.backends.paged_context.PagedAttentionContext``): it writes the chunk's keys/values
into the chunk's pages and attends through ``kernels.paged_attention`` over sink + window + own
pages, which is block-causal attention by chunk.

RoPE uses absolute latent-frame positions (a chunk starting at frame ``p`` gets time rows
``p..p+F-1``), as the causal Wan models do; the time axis is computed for any position, so a
stream is not limited to the model's ``rope_max_seq_len`` rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from diffusers.models.embeddings import get_1d_rotary_pos_embed
from diffusers.models.transformers.transformer_wan import WanAttnProcessor


@dataclass
class AttentionBinding:
    """The attention context of the forward in progress, shared by all paged processors."""

    context: Any = None


def chunk_rotary_emb(rope, frame_start: torch.Tensor, frames: int, height: int,
                     width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE tables of a batch of chunks at absolute frame positions.

    Args:
        rope: the model's ``WanRotaryPosEmbed`` (its ``t_dim/h_dim/w_dim`` and h/w tables).
        frame_start: ``(B,)`` int, the latent-frame index of each row's first frame.
        frames, height, width: post-patch sizes of the chunk.
    Returns:
        ``(cos, sin)``, each ``(B, frames*height*width, 1, head_dim)`` float32, token order
        frame-major then row then column (the order of the patch embedding's flatten).
    """
    b = frame_start.shape[0]
    pos = (frame_start.to(torch.float64).cpu()[:, None]
           + torch.arange(frames, dtype=torch.float64)).reshape(-1)
    t_cos, t_sin = get_1d_rotary_pos_embed(rope.t_dim, pos.numpy(), 10000.0, use_real=True,
                                           repeat_interleave_real=True,
                                           freqs_dtype=torch.float64)
    sizes = [rope.t_dim, rope.h_dim, rope.w_dim]
    _, h_cos, w_cos = rope.freqs_cos.split(sizes, dim=1)
    _, h_sin, w_sin = rope.freqs_sin.split(sizes, dim=1)

    def table(t, h, w):
        t = t.to(h.device).view(b, frames, 1, 1, -1).expand(b, frames, height, width, -1)
        h = h[:height].view(1, 1, height, 1, -1).expand(b, frames, height, width, -1)
        w = w[:width].view(1, 1, 1, width, -1).expand(b, frames, height, width, -1)
        return torch.cat([t, h, w], dim=-1).reshape(b, frames * height * width, 1, -1).float()

    return table(t_cos, h_cos, w_cos), table(t_sin, h_sin, w_sin)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate interleaved channel pairs ``(x[2i], x[2i+1])`` of ``x`` ``(B, L, H, D)`` by the
    angles whose cos/sin are given per channel (``(B or 1, L, 1, D)``, each value repeated for
    both channels of a pair); computed in float32, returned in ``x.dtype``."""
    x1, x2 = x.float().unflatten(-1, (-1, 2)).unbind(-1)
    c, s = cos[..., 0::2], sin[..., 1::2]
    return torch.stack([x1 * c - x2 * s, x1 * s + x2 * c], dim=-1).flatten(-2).type_as(x)


class WanPagedAttnProcessor:
    """``attn1`` of block ``layer``: diffusers' projections and RoPE, attention by the bound
    context's ``attend(q, k, v, layer)`` with ``(B, H, L, D)`` tensors.

    Raises RuntimeError when called with no context bound (a plain ``model.forward`` after
    :func:`install_paged_attention`; use ``engine.models.wan.model.WanChunkModel``).
    """

    def __init__(self, layer: int, binding: AttentionBinding):
        self.layer = layer
        self.binding = binding

    def __call__(self, attn, hidden_states: torch.Tensor,
                 encoder_hidden_states: torch.Tensor | None = None,
                 attention_mask: torch.Tensor | None = None,
                 rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        ctx = self.binding.context
        if ctx is None:
            raise RuntimeError("paged self-attention called outside a chunk forward "
                               "(no KV-cache context bound)")
        if encoder_hidden_states is not None or attention_mask is not None:
            raise ValueError("the paged processor serves self-attention only, without a mask")
        q = attn.norm_q(attn.to_q(hidden_states)).unflatten(2, (attn.heads, -1))
        k = attn.norm_k(attn.to_k(hidden_states)).unflatten(2, (attn.heads, -1))
        v = attn.to_v(hidden_states).unflatten(2, (attn.heads, -1))
        if rotary_emb is not None:
            q, k = apply_rotary(q, *rotary_emb), apply_rotary(k, *rotary_emb)
        out = ctx.attend(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), self.layer)
        out = out.transpose(1, 2).flatten(2, 3).type_as(hidden_states)
        return attn.to_out[1](attn.to_out[0](out))


def install_paged_attention(model) -> AttentionBinding:
    """Route every block's ``attn1`` of a ``WanTransformer3DModel`` through the paged cache
    (``attn2`` gets diffusers' default processor). Returns the binding a chunk forward sets."""
    binding = AttentionBinding()
    processors = {}
    for name in model.attn_processors:
        parts = name.split(".")  # blocks.N.attn1.processor
        if parts[0] == "blocks" and parts[2] == "attn1":
            processors[name] = WanPagedAttnProcessor(int(parts[1]), binding)
        else:
            processors[name] = WanAttnProcessor()
    model.set_attn_processor(processors)
    return binding
