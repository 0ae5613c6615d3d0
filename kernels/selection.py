"""Page selection: which pages each query block attends to, as CSR lists for ``paged_attention``.

Both selectors return ``(block_ptr, block_idx)``: int32 torch tensors (on ``device`` / on
``q.device``), rows in ``b * n_q_blocks + j`` order, page ids in time order within a list.
"""

from __future__ import annotations

import torch

from worldstream.kernels.page_lists import lists_to_csr


def static_page_list(
    page_table: list[int], *, sink_pages: int, window_pages: int, stride: int
) -> list[int]:
    """Sink + window + strided older pages of one page table (python ints, time order).

    ``page_table`` lists a session's pages oldest first. Kept: the first ``sink_pages``
    (attention sink), the last ``window_pages`` (window), and each older page whose position
    ``i`` in the table satisfies ``i % stride == 0`` (``stride=0``: none). Positions are
    absolute, so a page once kept by the stride stays kept as the stream grows.
    Raises ``ValueError`` for negative counts or stride.
    """
    if min(sink_pages, window_pages, stride) < 0:
        raise ValueError(
            f"sink_pages={sink_pages}, window_pages={window_pages}, "
            f"stride={stride} must all be >= 0"
        )
    n = len(page_table)
    window_start = max(n - window_pages, 0)
    return [
        page
        for i, page in enumerate(page_table)
        if i < sink_pages or i >= window_start or (stride > 0 and i % stride == 0)
    ]


def select_pages_static(
    page_tables: list[list[int]],
    *,
    sink_pages: int,
    window_pages: int,
    stride: int,
    n_q_blocks: int = 1,
    device: torch.device | str = "cpu",
) -> tuple[torch.Tensor, torch.Tensor]:
    """CSR lists for a batch: every query block of row ``b`` gets
    ``static_page_list(page_tables[b], ...)``. Returns int32 ``(block_ptr, block_idx)``.
    """
    if n_q_blocks <= 0:
        raise ValueError(f"n_q_blocks={n_q_blocks} must be positive")
    lists = []
    for table in page_tables:
        kept = static_page_list(
            table, sink_pages=sink_pages, window_pages=window_pages, stride=stride
        )
        lists.extend([kept] * n_q_blocks)
    return lists_to_csr(lists, device)


def _page_mean_keys(
    k_pool: torch.Tensor, pages: torch.Tensor, page_lens: torch.Tensor | None
) -> torch.Tensor:
    """Mean key over each page's valid tokens: ``[n, H, D]`` float32 (zeros for empty pages)."""
    keys = k_pool[pages].float()  # [n, H, ps, D]
    if page_lens is None:
        return keys.mean(dim=2)
    lens = page_lens.to(keys.device, torch.int64)[pages]
    valid = torch.arange(keys.shape[2], device=keys.device)[None, :] < lens[:, None]
    total = (keys * valid[:, None, :, None]).sum(dim=2)
    return total / lens.clamp(min=1)[:, None, None].to(total.dtype)


def select_pages_topk(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    always: list[list[int]],
    candidates: list[list[int]],
    k: int,
    q_block_size: int,
    *,
    page_lens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic top-k page selection per query block.

    Args:
        q: ``[B, H, Lq, D]`` queries; ``Lq`` a multiple of ``q_block_size``.
        k_pool: ``[P, H, page_size, D]`` key pages (same device as ``q``).
        always: ``B`` lists of page ids every query block of that row attends (sink, window).
        candidates: ``B`` lists of older page ids to choose from; ids also in ``always`` are
            ignored.
        k: pages kept per query block among the candidates (all of them if fewer).
        q_block_size: query tokens per query block.
        page_lens: optional ``[P]`` valid tokens per page; mean keys use valid tokens only.

    Score of candidate page ``p`` for query block ``j`` of row ``b``:
    ``sum_h dot(mean_t q[b, h, j*qbs + t], mean_s k_pool[p, h, s])`` (heads share one list).

    Returns:
        int32 ``(block_ptr [B * n_q_blocks + 1], block_idx [nnz])`` on ``q.device``; each list
        is ``always[b]`` followed by the chosen candidates in their given order.

    Raises:
        ValueError: list counts not matching ``B``, ``k < 0``, bad ``q_block_size``, page ids
            out of ``[0, P)``.
    """
    if q.dim() != 4 or k_pool.dim() != 4:
        raise ValueError(f"q {tuple(q.shape)} and k_pool {tuple(k_pool.shape)} must be 4-D")
    batch, heads, q_len, head_dim = q.shape
    num_pages = k_pool.shape[0]
    if len(always) != batch or len(candidates) != batch:
        raise ValueError(
            f"need {batch} 'always' and 'candidates' lists, got {len(always)} and {len(candidates)}"
        )
    if k < 0:
        raise ValueError(f"k={k} must be >= 0")
    if q_block_size <= 0 or q_len % q_block_size:
        raise ValueError(f"Lq={q_len} must be a positive multiple of q_block_size={q_block_size}")
    for name, lists in (("always", always), ("candidates", candidates)):
        for b, pages in enumerate(lists):
            for page in pages:
                if not 0 <= page < num_pages:
                    raise ValueError(f"{name}[{b}] holds page {page}, outside [0, {num_pages})")
    n_q_blocks = q_len // q_block_size
    q_mean = q.float().reshape(batch, heads, n_q_blocks, q_block_size, head_dim).mean(dim=3)
    lists: list[list[int]] = []
    for b in range(batch):
        kept_always = set(always[b])
        pool = [p for p in dict.fromkeys(candidates[b]) if p not in kept_always]
        if k == 0 or not pool:
            lists.extend([list(always[b])] * n_q_blocks)
            continue
        page_ids = torch.tensor(pool, dtype=torch.int64, device=q.device)
        mean_keys = _page_mean_keys(k_pool, page_ids, page_lens)  # [n, H, D]
        scores = torch.einsum("hjd,nhd->jn", q_mean[b], mean_keys)
        top = torch.topk(scores, min(k, len(pool)), dim=1).indices.tolist()
        for chosen in top:
            chosen_set = set(chosen)
            lists.append(list(always[b]) + [p for i, p in enumerate(pool) if i in chosen_set])
    return lists_to_csr(lists, q.device)
