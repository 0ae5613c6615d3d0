"""The action modules' keys and values in pages, beside the self-attention's KV pool.

A page of the paged KV cache holds one latent frame; the mouse and keyboard attentions of the
Matrix-Game action modules keep one entry per latent frame too (the mouse one per spatial
token, the keyboard one per frame), so they live in pools indexed by the same page ids: a
session's page table then forks, rewinds, evicts and frees them with its self-attention pages,
and a chunk attends exactly the frames its self-attention attends (its own and the local
window's).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from worldstream.engine.backends.paged_context import PagedAttentionContext


class ActionPools:
    """The action modules' keys/values: ``mouse_k``/``mouse_v`` ``(layers, pages, tokens,
    heads, head_dim)`` (None without a mouse branch) and ``key_k``/``key_v`` ``(layers, pages,
    heads, head_dim)``, zero-filled, allocated once.

    Args:
        layers: blocks with an action module. pages: page ids of the KV pool (same ids).
        tokens: spatial tokens per latent frame. heads, head_dim: of the action attentions.
        mouse: whether the model has the mouse branch.
    """

    def __init__(self, layers: int, pages: int, tokens: int, heads: int, head_dim: int,
                 mouse: bool, dtype: torch.dtype, device: torch.device):
        shape = (layers, pages, tokens, heads, head_dim)
        self.mouse_k = torch.zeros(shape, dtype=dtype, device=device) if mouse else None
        self.mouse_v = torch.zeros(shape, dtype=dtype, device=device) if mouse else None
        self.key_k = torch.zeros(layers, pages, heads, head_dim, dtype=dtype, device=device)
        self.key_v = torch.zeros_like(self.key_k)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in
                   (self.mouse_k, self.mouse_v, self.key_k, self.key_v) if t is not None)


class MatrixGameAttention:
    """One forward's attention: the self-attention over the KV pool (``attend``, the shared
    :class:`PagedAttentionContext`) and the action modules' over :class:`ActionPools`
    (``attend_mouse``, ``attend_keyboard``), each row over the pages its context lists (its
    own chunk's included: block-causal)."""

    def __init__(self, paged: PagedAttentionContext, pools: ActionPools):
        self.paged, self.pools = paged, pools
        self.new_pages = paged.new_pages
        device = paged.new_pages.device
        self._rows = [torch.tensor(pages, device=device) for pages in paged.always]

    def attend(self, q, k, v, layer: int) -> torch.Tensor:
        return self.paged.attend(q, k, v, layer)

    def _write(self, pool_k, pool_v, k, v, layer: int) -> None:
        """Frame-major ``k``/``v`` ``(B * F, ...)`` into this chunk's pages."""
        pool_k[layer].index_copy_(0, self.new_pages, k.to(pool_k.dtype))
        pool_v[layer].index_copy_(0, self.new_pages, v.to(pool_v.dtype))

    def attend_mouse(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     layer: int) -> torch.Tensor:
        """Each spatial token's attention over time: ``q``/``k``/``v`` ``(B, S, F, H, D)`` of
        this chunk; keys/values written to its pages, queries attend the row's pages.
        Returns ``(B, S, F, H, D)`` in ``q``'s dtype."""
        pools = self.pools
        b, s, f, h, d = k.shape
        self._write(pools.mouse_k, pools.mouse_v, k.transpose(1, 2).reshape(b * f, s, h, d),
                    v.transpose(1, 2).reshape(b * f, s, h, d), layer)
        out = []
        for row, pages in enumerate(self._rows):
            keys = pools.mouse_k[layer, pages].permute(1, 2, 0, 3)  # (S, H, P, D)
            values = pools.mouse_v[layer, pages].permute(1, 2, 0, 3)
            query = q[row].permute(0, 2, 1, 3).to(keys.dtype)  # (S, H, F, D)
            out.append(F.scaled_dot_product_attention(query, keys, values).permute(0, 2, 1, 3))
        return torch.stack(out).to(q.dtype)

    def attend_keyboard(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        layer: int) -> torch.Tensor:
        """Every token's attention over the frames' keyboard entries: ``q`` ``(B, S, F, H,
        D)``, ``k``/``v`` ``(B, F, H, D)`` of this chunk (written to its pages). Returns ``(B,
        S, F, H, D)`` in ``q``'s dtype."""
        pools = self.pools
        b, f, h, d = k.shape
        self._write(pools.key_k, pools.key_v, k.reshape(b * f, h, d), v.reshape(b * f, h, d),
                    layer)
        out = []
        for row, pages in enumerate(self._rows):
            query = q[row].permute(0, 2, 1, 3).to(pools.key_k.dtype)  # (S, H, F, D)
            # one key per frame, the same for every token (a view, not a copy)
            keys = pools.key_k[layer, pages].permute(1, 0, 2).expand(query.shape[0], -1, -1,
                                                                     -1)  # (S, H, P, D)
            values = pools.key_v[layer, pages].permute(1, 0, 2).expand(query.shape[0], -1,
                                                                       -1, -1)
            out.append(F.scaled_dot_product_attention(query, keys, values).permute(0, 2, 1, 3))
        return torch.stack(out).to(q.dtype)
