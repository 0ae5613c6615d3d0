"""Reference backend: gather each query block's pages, then one masked SDPA call.

This is the ground truth every other backend is tested against, and on CPU the default: the
gathered keys are only the listed pages, so its cost follows the sparsity, and it needs no
compilation. (It gathers per query block, not each batch row's union of pages once: top-k
lists differ between a row's query blocks, so a union would gather far more.)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from worldstream.kernels.page_lists import (
    AttentionShape,
    PaddedPages,
    merge_query_blocks,
    split_query_blocks,
)


def _gather_pages(pool: torch.Tensor, page_ids: torch.Tensor) -> torch.Tensor:
    """``pool [P, H, ps, D]``, ``page_ids [rows, width]`` -> ``[rows, H, width * ps, D]``."""
    rows, width = page_ids.shape
    _, h, ps, d = pool.shape
    # NOTE: index_select + one permuting copy: much faster than advanced indexing here.
    picked = pool.index_select(0, page_ids.reshape(-1)).view(rows, width, h, ps, d)
    return picked.transpose(1, 2).reshape(rows, h, width * ps, d)


def reference_paged_attention(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    pages: PaddedPages,
    page_lens: torch.Tensor | None,
    scale: float,
    shape: AttentionShape,
    dense: bool = False,
) -> torch.Tensor:
    """Paged attention by gathering; inputs already validated. Returns ``[B, H, Lq, D]``.

    Rows whose lists hold no valid token (empty list, or only empty pages) return zeros.
    ``dense``: the caller knows every list has the full width and every page is full (no key
    masked), so SDPA runs without a mask.
    """
    rows, width = pages.page_ids.shape
    if width == 0:
        return torch.zeros_like(q)
    ps = shape.page_size
    keys = _gather_pages(k_pool, pages.page_ids)
    values = _gather_pages(v_pool, pages.page_ids)
    if dense:
        out = F.scaled_dot_product_attention(split_query_blocks(q, shape), keys, values,
                                             scale=scale)
        return merge_query_blocks(out, shape)
    token_ok = pages.is_listed[:, :, None].expand(rows, width, ps)
    if page_lens is not None:
        slot = torch.arange(ps, device=q.device)
        token_ok = token_ok & (
            slot[None, None, :] < page_lens.to(torch.int64)[pages.page_ids][..., None]
        )
    token_ok = token_ok.reshape(rows, 1, 1, width * ps)
    out = F.scaled_dot_product_attention(
        split_query_blocks(q, shape), keys, values, attn_mask=token_ok, scale=scale
    )
    # NOTE: SDPA gives NaN (or garbage) for rows with every key masked; define them as zeros.
    has_keys = token_ok.any(dim=-1, keepdim=True)
    out = torch.where(has_keys, out, torch.zeros((), dtype=out.dtype, device=out.device))
    return merge_query_blocks(out, shape)
