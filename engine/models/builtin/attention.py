"""The world model's one attention call site.

``attend(q, k, v, layer, ctx)`` is called by every transformer block. Two contexts:

* :class:`DenseContext` — a whole token sequence at once (training, reference forward): SDPA with a
  boolean frame-level mask (block-causal by chunk, or any mask the caller builds).
* a paged context (``engine.backends.paged_context.PagedAttentionContext``) — the engine's
  streaming path: it writes the chunk's keys/values into the session's KV-cache pages and
  attends through ``kernels.paged_attention`` over the CSR page lists (sink + window +
  selected pages).

Tensors are ``(batch, heads, tokens, head_dim)``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F


class AttentionContext(Protocol):
    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int
    ) -> torch.Tensor: ...


@dataclass
class DenseContext:
    """Dense attention over the full sequence with a token-level boolean mask
    ``(tokens, tokens)`` (True = may attend), shared by the batch."""

    mask: torch.Tensor

    def attend(self, q, k, v, layer):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask)


def block_causal_frame_mask(num_frames: int, chunk_frames: int) -> torch.Tensor:
    """``(num_frames, num_frames)`` bool: frame i may attend frame j iff chunk(j) <= chunk(i)."""
    chunk = torch.arange(num_frames) // chunk_frames
    return chunk[None, :] <= chunk[:, None]


def expand_frame_mask(frame_mask: torch.Tensor, tokens_per_frame: int) -> torch.Tensor:
    """Frame-level mask ``(..., L, L)`` -> token-level mask ``(..., L·n, L·n)`` (each frame =
    ``n = tokens_per_frame`` tokens; leading dims, e.g. a batch, kept)."""
    return (frame_mask.repeat_interleave(tokens_per_frame, -2)
            .repeat_interleave(tokens_per_frame, -1))


def teacher_forcing_frame_mask(num_frames: int, chunk_frames: int) -> torch.Tensor:
    """Mask over ``[context frames ; target frames]`` (2·num_frames): context is block-causal;
    target chunk i attends to context chunks < i and to itself — exactly what it sees at
    inference (cached clean chunks, then its own noisy tokens). Source: CausVid / Self-Forcing
    teacher-forcing training."""
    chunk = torch.arange(num_frames) // chunk_frames
    ctx_ctx = chunk[None, :] <= chunk[:, None]
    tgt_ctx = chunk[None, :] < chunk[:, None]
    tgt_tgt = chunk[None, :] == chunk[:, None]
    top = torch.cat([ctx_ctx, torch.zeros_like(ctx_ctx)], dim=1)
    bottom = torch.cat([tgt_ctx, tgt_tgt], dim=1)
    return torch.cat([top, bottom], dim=0)


# NOTE: inside a torch.compile graph the paged context is an opaque custom op: tracing it would
# recompile for every context length, and torch.compiler.disable would split each forward into
# several graphs. The caller binds the context (:func:`bound`), since the op cannot take it.
# It writes the KV pool yet is declared pure (``mutates_args=()``): safe because each call's
# output feeds the next layer and no two calls share a layer; inference only (no backward, and
# a CUDA-graph mode would replay stale page lists).
_bound = threading.local()


@contextmanager
def bound(ctx: AttentionContext) -> Iterator[None]:
    """Bind ``ctx`` as the attention context of the compiled forwards run inside the block
    (this thread only; nests, restoring the outer one)."""
    outer = getattr(_bound, "ctx", None)
    _bound.ctx = ctx
    try:
        yield
    finally:
        _bound.ctx = outer


@torch.library.custom_op("worldstream::attend", mutates_args=())
def _bound_attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int) -> torch.Tensor:
    ctx = getattr(_bound, "ctx", None)
    if ctx is None:
        raise RuntimeError("a compiled world model attends through the context bound by "
                           "engine.models.builtin.attention.bound(ctx); none is bound")
    return ctx.attend(q, k, v, layer).to(q.dtype).contiguous()


@_bound_attend.register_fake
def _(q, k, v, layer):
    return torch.empty_like(q, memory_format=torch.contiguous_format)


def attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int, ctx: AttentionContext
) -> torch.Tensor:
    """The single attention call of the model: ``(B, H, Lq, D)`` -> ``(B, H, Lq, D)``. Under
    torch.compile it calls the context bound by :func:`bound` (RuntimeError when none is),
    not ``ctx``."""
    if torch.compiler.is_compiling():
        return _bound_attend(q, k, v, layer)
    return ctx.attend(q, k, v, layer)
