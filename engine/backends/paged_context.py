"""Attention over the shared KV page pool for one forward of a batch of chunks."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from worldstream import kernels


class PagedAttentionContext:
    """Attention over the KV pool for one forward of a batch of chunks.

    ``k_pool``/``v_pool``: ``(layers, pages, heads, page_size, head_dim)``. ``new_pages``:
    ``(B * pages_per_chunk,)`` page ids the chunk's keys/values are written to;
    ``always``/``candidates``: per batch row, pages always attended (sink + window + selected +
    own) and older pages to pick ``topk`` from per layer by key similarity. The CSR page lists
    are built on the pool's device (``kernels.paged_attention`` refuses mixed devices).
    """

    def __init__(
        self,
        k_pool: torch.Tensor,
        v_pool: torch.Tensor,
        new_pages: torch.Tensor,
        always: list[list[int]],
        candidates: list[list[int]],
        topk: int,
        backend: str,
    ):
        self.k_pool, self.v_pool = k_pool, v_pool
        self.new_pages = new_pages
        self.always, self.candidates, self.topk = always, candidates, topk
        self.backend = backend
        self._guided: dict[int, PagedAttentionContext] = {}
        ptr, idx = kernels.lists_to_csr(always, device=k_pool.device)
        # the lists are the same for every layer and denoising step of this forward batch:
        # checked and laid out once (kernels.plan_paged_attention)
        # (one query block per batch row: the chunk's frames attend as one block)
        page_size = k_pool.shape[3]
        q_block = len(new_pages) // max(len(always), 1) * page_size
        self._plan = kernels.plan_paged_attention(
            ptr, idx, num_pages=k_pool.shape[1], page_size=page_size,
            q_block_size=q_block or None, backend=backend)

    def with_negatives(self, copies: int, scratch: list[int]) -> PagedAttentionContext:
        """The context of one forward of ``copies`` negative batches stacked before this
        context's rows (rows ``[negative 1 (B); ...; negative n (B); conditional (B)]``): each
        negative row attends what its conditional row attends, with its own chunk's
        keys/values written to ``scratch`` pages (at least ``copies * B * pages_per_chunk``
        ids outside the allocator) instead of the chunk's pages, so that the conditional
        rows' keys/values are the ones the cache keeps. Built once per ``copies``."""
        if copies not in self._guided:
            rows = len(self.always)
            per_row = len(self.new_pages) // max(rows, 1)
            own = self.new_pages.tolist()
            if len(scratch) < copies * len(own):
                raise ValueError(f"{copies} negative copies of {len(own)} pages need as many "
                                 f"scratch pages, got {len(scratch)}")
            new_pages, always = [], []
            for c in range(copies):
                for r in range(rows):
                    mine = scratch[(c * rows + r) * per_row:(c * rows + r + 1) * per_row]
                    swap = dict(zip(own[r * per_row:(r + 1) * per_row], mine))
                    new_pages += mine
                    always.append([swap.get(p, p) for p in self.always[r]])
            self._guided[copies] = PagedAttentionContext(
                self.k_pool, self.v_pool,
                torch.cat([torch.tensor(new_pages, device=self.new_pages.device),
                           self.new_pages]),
                always + self.always, self.candidates * copies + self.candidates, self.topk,
                self.backend)
        return self._guided[copies]

    def attend(self, q, k, v, layer: int) -> torch.Tensor:
        """Write this chunk's keys/values ``(B, H, F * page, D)`` into its pages, then attend
        ``q`` ``(B, H, F * page, D)`` to the listed pages; returns ``(B, H, F * page, D)``."""
        b, h, lq, d = k.shape
        page = self.k_pool.shape[3]

        def to_pages(x):  # (B, H, F*page, D) -> (B*F, H, page, D)
            return x.reshape(b, h, lq // page, page, d).transpose(1, 2).reshape(-1, h, page, d)

        self.k_pool[layer].index_copy_(0, self.new_pages, to_pages(k).to(self.k_pool.dtype))
        self.v_pool[layer].index_copy_(0, self.new_pages, to_pages(v).to(self.v_pool.dtype))
        if self.topk and any(self.candidates):
            ptr, idx = kernels.select_pages_topk(
                q, self.k_pool[layer], self.always, self.candidates, self.topk, lq
            )
            return kernels.paged_attention(
                q.to(self.k_pool.dtype), self.k_pool[layer], self.v_pool[layer], ptr, idx,
                q_block_size=lq, backend=self.backend,
            )
        return self._plan.run(q.to(self.k_pool.dtype), self.k_pool[layer], self.v_pool[layer])


def batched_forwards(forward: Callable[..., torch.Tensor], x: torch.Tensor, sigma: float,
                     conds: list[tuple], ctx: PagedAttentionContext, scratch: list[int],
                     batched: bool) -> list[torch.Tensor]:
    """``forward(x, sigma, cond, ctx)`` of the same chunks ``x`` under each conditioning of
    ``conds`` — negatives first, the conditional one last (its keys/values are the ones
    kept) — each a tuple of batch-first tensors or None. ``batched``: one forward of the
    stacked rows, the negatives' keys/values written to ``scratch`` pages; else one forward
    each, in order. Returns the outputs in the order of ``conds``."""
    n = len(conds)
    if n == 1 or not batched:
        return [forward(x, sigma, cond, ctx) for cond in conds]
    stacked: Any = tuple(None if parts[0] is None else torch.cat(parts) for parts in zip(*conds))
    out = forward(torch.cat([x] * n), sigma, stacked, ctx.with_negatives(n - 1, scratch))
    return list(out.chunk(n))
