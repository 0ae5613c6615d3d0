"""Shared builders for the kernels tests: random paged-attention cases and an independent
dense masked-SDPA oracle. (No tests here; the name only keeps it within the kernels' files.)"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from hypothesis import strategies as st


@dataclass
class PagedCase:
    q: torch.Tensor  # [B, H, Lq, D]
    k_pool: torch.Tensor  # [P, H, ps, D]
    v_pool: torch.Tensor
    lists: list[list[int]]  # one per row b * n_q_blocks + j
    page_lens: torch.Tensor | None  # [P]
    q_block_size: int

    def csr(self) -> tuple[torch.Tensor, torch.Tensor]:
        lengths = [0] + [len(pages) for pages in self.lists]
        ptr = torch.tensor(lengths, dtype=torch.int64).cumsum(0)
        idx = torch.tensor([p for pages in self.lists for p in pages], dtype=torch.int64)
        return ptr.to(self.q.device), idx.to(self.q.device)

    def run(self, backend: str) -> torch.Tensor:
        """``paged_attention`` of this case through ``backend``."""
        from worldstream.kernels import paged_attention

        ptr, idx = self.csr()
        return paged_attention(self.q, self.k_pool, self.v_pool, ptr, idx,
                               page_lens=self.page_lens, q_block_size=self.q_block_size,
                               backend=backend)

    def to(self, device, dtype=None) -> PagedCase:
        def move(t):
            return t.to(device=device, dtype=dtype or t.dtype)

        lens = None if self.page_lens is None else self.page_lens.to(device)
        return PagedCase(
            move(self.q), move(self.k_pool), move(self.v_pool), self.lists, lens, self.q_block_size
        )


@st.composite
def paged_cases(
    draw,
    *,
    head_dims=(32, 64, 128),
    page_sizes=(16, 64),
    dtype=torch.float32,
    batch=None,
    n_q_blocks=None,
    num_pages=None,
    heads=None,
    q_block_sizes=None,
    device="cpu",
) -> PagedCase:
    """Random case: ragged lists in random order, some empty, partly filled/empty pages."""
    head_dim = draw(st.sampled_from(head_dims))
    page_size = draw(st.sampled_from(page_sizes))
    qbs = draw(st.sampled_from(q_block_sizes or (16, page_size)))
    b = batch or draw(st.integers(1, 2))
    h = heads or draw(st.integers(1, 3))
    nqb = n_q_blocks or draw(st.integers(1, 3))
    p = num_pages or draw(st.integers(1, 6))
    lists = []
    for _ in range(b * nqb):
        order = draw(st.permutations(range(p)))
        lists.append(list(order[: draw(st.integers(0, p))]))
    if draw(st.booleans()):
        page_lens = torch.tensor(
            draw(
                st.lists(
                    st.one_of(st.just(page_size), st.integers(0, page_size)), min_size=p, max_size=p
                )
            )
        )
    else:
        page_lens = None
    seed = draw(st.integers(0, 2**31 - 1))
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, nqb * qbs, head_dim, generator=gen)
    k = torch.randn(p, h, page_size, head_dim, generator=gen)
    v = torch.randn(p, h, page_size, head_dim, generator=gen)
    case = PagedCase(q, k, v, lists, page_lens, qbs)
    return case.to(device, dtype)


def dense_masked_sdpa(case: PagedCase, scale: float | None = None) -> torch.Tensor:
    """Oracle: every batch row attends to the whole pool laid out densely (page-major), with a
    boolean mask built token by token from the lists and page_lens; empty rows give zeros."""
    q, k_pool, v_pool = case.q.float(), case.k_pool.float(), case.v_pool.float()
    b, h, lq, d = q.shape
    p, _, ps, _ = k_pool.shape
    keys = k_pool.transpose(0, 1).reshape(1, h, p * ps, d)
    values = v_pool.transpose(0, 1).reshape(1, h, p * ps, d)
    mask = torch.zeros(b, 1, lq, p * ps, dtype=torch.bool)
    nqb = lq // case.q_block_size
    for row, pages in enumerate(case.lists):
        bi, j = divmod(row, nqb)
        rows = slice(j * case.q_block_size, (j + 1) * case.q_block_size)
        for page in pages:
            n = ps if case.page_lens is None else int(case.page_lens[page])
            mask[bi, 0, rows, page * ps : page * ps + n] = True
    mask = mask.to(q.device)
    out = F.scaled_dot_product_attention(
        q, keys.expand(b, -1, -1, -1), values.expand(b, -1, -1, -1), attn_mask=mask, scale=scale
    )
    return torch.where(mask.any(-1, keepdim=True), out, 0.0)
