"""FlexAttention backend: the page pool viewed as one long key sequence plus a BlockMask.

Layout (no copy of the pool): ``k_pool [P, H, ps, D]`` is viewed as ``[1, 1, P * H * ps, D]``,
so KV block ``p * H + h`` (block size ``ps``) is page ``p`` of head ``h``. Queries are laid out
as ``[1, 1, H * R_pad * qbs, D]`` in ``(head, row, token)`` order, so query block ``h * R_pad + r``
attends to KV blocks ``{p * H + h : p in list(r)}``. Fully filled pages are "full" blocks (no
mask evaluated); partly filled ones are "partial" blocks whose ``mask_mod`` hides the tail.

Compilation: ``torch.compile(dynamic=False)`` of the whole mask-build + attention function,
created once per process. It recompiles per distinct (head_dim, dtype, q_block_size,
page_size, pool size, padded row count); rows are padded to a power of two so a changing
batch size costs at most log2 recompiles; each compile is slow on a CPU.
"""

from __future__ import annotations

import functools

import torch
from torch.nn.attention.flex_attention import BlockMask, flex_attention

from worldstream.kernels.page_lists import (
    AttentionShape,
    PaddedPages,
    merge_query_blocks,
    split_query_blocks,
)

# NOTE: the CUDA flex kernel tiles query blocks by 128 rows; query blocks are zero-padded to a
# multiple of it there (padded rows are computed and dropped). CPU kernels take any size.
_Q_GRANULE = {"cuda": 128}

# NOTE: each distinct row bucket / pool size is a compiled variant; the engine keeps both fixed.
_RECOMPILE_LIMIT = 32


def _next_pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def _pack(
    selected: torch.Tensor, page_ids: torch.Tensor, width: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Move the selected entries of each row to the front; pad rows to ``width`` columns."""
    order = torch.argsort((~selected).to(torch.int8), dim=1, stable=True)
    packed = torch.gather(torch.where(selected, page_ids, 0), 1, order)
    out = torch.zeros(page_ids.shape[0], width, dtype=torch.int32, device=page_ids.device)
    out[:, : packed.shape[1]] = packed
    return selected.sum(dim=1).to(torch.int32), out


def _attend(
    q,
    k,
    v,
    num_partial,
    idx_partial,
    num_full,
    idx_full,
    block_lens,
    scale,
    q_block_size: int,
    page_size: int,
):
    def mask_mod(b, h, q_idx, kv_idx):
        return (kv_idx % page_size) < block_lens[kv_idx // page_size]

    block_mask = BlockMask.from_kv_blocks(
        num_partial,
        idx_partial,
        num_full,
        idx_full,
        BLOCK_SIZE=(q_block_size, page_size),
        mask_mod=mask_mod,
        seq_lengths=(q.shape[2], k.shape[2]),
        compute_q_blocks=False,
    )
    return flex_attention(q, k, v, block_mask=block_mask, scale=scale)


@functools.cache
def _compiled_attend():
    torch._dynamo.config.cache_size_limit = max(
        torch._dynamo.config.cache_size_limit, _RECOMPILE_LIMIT
    )
    return torch.compile(_attend, dynamic=False)


def flex_paged_attention(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    pages: PaddedPages,
    page_lens: torch.Tensor | None,
    scale: float,
    shape: AttentionShape,
) -> torch.Tensor:
    """Paged attention with compiled FlexAttention; inputs already validated.

    Returns ``[B, H, Lq, D]`` in ``q.dtype``; rows without valid keys return zeros.
    """
    h, ps, d, num_pages = shape.heads, shape.page_size, shape.head_dim, shape.num_pages
    rows, rows_pad = shape.num_rows, _next_pow2(shape.num_rows)

    lens = (
        torch.full((num_pages,), ps, dtype=torch.int32, device=q.device)
        if page_lens is None
        else page_lens.to(torch.int32)
    )
    page_full = lens[pages.page_ids] == ps
    block_ids = pages.page_ids * h  # + head, below
    # NOTE: the KV-block axis must span the whole flattened pool (P * H blocks) or inductor
    # rejects the mask; only the first ``num`` entries of each row are read.
    width = num_pages * h
    num_full, idx_full = _pack(pages.is_listed & page_full, block_ids, width)
    num_part, idx_part = _pack(pages.is_listed & ~page_full, block_ids, width)

    def per_head(num: torch.Tensor, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # rows -> (head, padded row); padded rows list nothing.
        num_h = torch.zeros(h, rows_pad, dtype=torch.int32, device=q.device)
        num_h[:, :rows] = num
        idx_h = torch.zeros(h, rows_pad, width, dtype=torch.int32, device=q.device)
        heads = torch.arange(h, dtype=torch.int32, device=q.device)[:, None, None]
        idx_h[:, :rows] = idx[None] + heads
        return num_h.reshape(1, 1, h * rows_pad), idx_h.reshape(1, 1, h * rows_pad, width)

    num_full, idx_full = per_head(num_full, idx_full)
    num_part, idx_part = per_head(num_part, idx_part)

    qbs = shape.q_block_size
    qbs_pad = _round_up(qbs, _Q_GRANULE.get(q.device.type, 1))
    q_rows = split_query_blocks(q, shape).transpose(0, 1)  # [H, rows, qbs, D]
    q_flat = q.new_zeros(h, rows_pad, qbs_pad, d)
    q_flat[:, :rows, :qbs] = q_rows
    q_flat = q_flat.reshape(1, 1, h * rows_pad * qbs_pad, d)
    k_flat = k_pool.reshape(1, 1, num_pages * h * ps, d)
    v_flat = v_pool.reshape(1, 1, num_pages * h * ps, d)
    block_lens = lens.repeat_interleave(h)

    out = _compiled_attend()(
        q_flat, k_flat, v_flat, num_part, idx_part, num_full, idx_full, block_lens, scale,
        qbs_pad, ps,
    )
    out = out.reshape(h, rows_pad, qbs_pad, d)[:, :rows, :qbs].transpose(0, 1)
    return merge_query_blocks(out, shape)
