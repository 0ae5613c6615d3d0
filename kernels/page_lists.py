"""CSR page lists: validation of ``paged_attention`` inputs and conversion to padded form.

A *row* is one query block of one batch row: row ``r = b * n_q_blocks + j`` attends to the pages
``block_idx[block_ptr[r]:block_ptr[r + 1]]``. Every backend shares the checks here, so a bad
input raises the same ``ValueError`` whichever backend runs, before any work is done.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

_INDEX_DTYPES = (torch.int32, torch.int64)


@dataclass(frozen=True)
class AttentionShape:
    """Sizes read off validated inputs (all plain ints)."""

    batch: int
    heads: int
    q_len: int
    head_dim: int
    num_pages: int
    page_size: int
    q_block_size: int

    @property
    def n_q_blocks(self) -> int:
        return self.q_len // self.q_block_size

    @property
    def num_rows(self) -> int:
        return self.batch * self.n_q_blocks


@dataclass(frozen=True)
class PaddedPages:
    """Page lists as a dense table.

    ``page_ids``: int64 ``[num_rows, max_pages]``, padding entries hold 0.
    ``is_listed``: bool ``[num_rows, max_pages]``, False on padding.
    ``counts``: int64 ``[num_rows]``, length of each list.
    """

    page_ids: torch.Tensor
    is_listed: torch.Tensor
    counts: torch.Tensor


def _block_dims(shape: AttentionShape) -> tuple[int, int, int, int, int]:
    """``(batch, heads, n_q_blocks, q_block_size, head_dim)`` of ``shape``."""
    return shape.batch, shape.heads, shape.n_q_blocks, shape.q_block_size, shape.head_dim


def split_query_blocks(q: torch.Tensor, shape: AttentionShape) -> torch.Tensor:
    """``[B, H, Lq, D]`` -> ``[B * n_q_blocks, H, q_block_size, D]``, row ``b * n_q_blocks + j``."""
    b, h, nqb, qbs, d = _block_dims(shape)
    return q.reshape(b, h, nqb, qbs, d).transpose(1, 2).reshape(b * nqb, h, qbs, d)


def merge_query_blocks(out: torch.Tensor, shape: AttentionShape) -> torch.Tensor:
    """Inverse of :func:`split_query_blocks`."""
    b, h, nqb, qbs, d = _block_dims(shape)
    return out.reshape(b, nqb, h, qbs, d).transpose(1, 2).reshape(b, h, shape.q_len, d)


def _fail(message: str) -> None:
    raise ValueError(message)


def validate_tensors(
    q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, q_block_size: int | None
) -> AttentionShape:
    """Check the query and the pools of ``paged_attention`` (ranks, float dtypes that match,
    heads/head_dim of the pool, one device, ``Lq`` a positive multiple of ``q_block_size``)
    and return the sizes: plain attribute reads, no tensor work. ``ValueError``."""
    for name, t in (("q", q), ("k_pool", k_pool), ("v_pool", v_pool)):
        if t.dim() != 4:
            _fail(f"{name} must have 4 dimensions, got shape {tuple(t.shape)}")
        if not t.is_floating_point():
            _fail(f"{name} must be a floating-point tensor, got {t.dtype}")
    if k_pool.shape != v_pool.shape:
        _fail(f"k_pool {tuple(k_pool.shape)} and v_pool {tuple(v_pool.shape)} differ in shape")
    batch, heads, q_len, head_dim = q.shape
    num_pages, pool_heads, page_size, pool_dim = k_pool.shape
    if (pool_heads, pool_dim) != (heads, head_dim):
        _fail(
            f"q has {heads} heads of dim {head_dim} but the pool has {pool_heads} heads of "
            f"dim {pool_dim}"
        )
    if not (q.dtype == k_pool.dtype == v_pool.dtype):
        _fail(f"dtypes differ: q {q.dtype}, k_pool {k_pool.dtype}, v_pool {v_pool.dtype}")
    devices = {"q": q.device, "k_pool": k_pool.device, "v_pool": v_pool.device}
    if len(set(devices.values())) != 1:
        _fail(f"all tensors must be on one device, got {devices}")
    q_block_size = page_size if q_block_size is None else int(q_block_size)
    if q_block_size <= 0 or q_len % q_block_size != 0:
        _fail(f"Lq={q_len} must be a positive multiple of q_block_size={q_block_size}")
    return AttentionShape(batch, heads, q_len, head_dim, num_pages, page_size, q_block_size)


def validate_lists(
    block_ptr: torch.Tensor,
    block_idx: torch.Tensor,
    page_lens: torch.Tensor | None,
    num_rows: int,
    num_pages: int,
    page_size: int,
) -> None:
    """Check CSR page lists for ``num_rows`` query blocks over a pool of ``num_pages`` pages of
    ``page_size`` tokens. ``ValueError`` for: lists on several devices; non-int32/int64 or
    non-1-D lists; a ``block_ptr`` of the wrong length, not starting at 0, decreasing, or not
    ending at ``len(block_idx)``; page ids out of ``[0, P)`` (naming the first offending index
    and value); a page listed twice for one query block; ``page_lens`` of the wrong shape or
    outside ``[0, page_size]``."""
    tensors = {"block_ptr": block_ptr, "block_idx": block_idx}
    if page_lens is not None:
        tensors["page_lens"] = page_lens
    devices = {name: t.device for name, t in tensors.items()}
    if len(set(devices.values())) != 1:
        _fail(f"all tensors must be on one device, got {devices}")
    for name, t in (("block_ptr", block_ptr), ("block_idx", block_idx)):
        if t.dim() != 1 or t.dtype not in _INDEX_DTYPES:
            _fail(f"{name} must be a 1-D int32/int64 tensor, got {t.dtype} {tuple(t.shape)}")
    if block_ptr.numel() != num_rows + 1:
        _fail(
            f"block_ptr must have B * n_q_blocks + 1 = {num_rows + 1} entries, "
            f"got {block_ptr.numel()}"
        )
    ptr = block_ptr.to("cpu", torch.int64)
    if int(ptr[0]) != 0 or int(ptr[-1]) != block_idx.numel():
        _fail(
            f"block_ptr must start at 0 and end at len(block_idx)={block_idx.numel()}, "
            f"got {int(ptr[0])} .. {int(ptr[-1])}"
        )
    steps = ptr[1:] - ptr[:-1]
    if bool((steps < 0).any()):
        row = int(torch.nonzero(steps < 0)[0, 0])
        _fail(f"block_ptr decreases at index {row + 1}: {int(ptr[row])} -> {int(ptr[row + 1])}")
    idx = block_idx.to("cpu", torch.int64)
    bad = (idx < 0) | (idx >= num_pages)
    if bool(bad.any()):
        at = int(torch.nonzero(bad)[0, 0])
        _fail(f"block_idx[{at}] = {int(idx[at])} is out of range for a pool of {num_pages} pages")

    if page_lens is not None:
        if page_lens.shape != (num_pages,) or page_lens.dtype not in _INDEX_DTYPES:
            _fail(
                f"page_lens must be an int32/int64 tensor of shape ({num_pages},), "
                f"got {page_lens.dtype} {tuple(page_lens.shape)}"
            )
        lens = page_lens.to("cpu", torch.int64)
        bad = (lens < 0) | (lens > page_size)
        if bool(bad.any()):
            at = int(torch.nonzero(bad)[0, 0])
            _fail(f"page_lens[{at}] = {int(lens[at])} is outside [0, page_size={page_size}]")
    _check_no_repeats(ptr, idx)


def _check_no_repeats(ptr: torch.Tensor, idx: torch.Tensor) -> None:
    # NOTE: a page listed twice would be counted twice by the softmax; reject it instead of
    # letting backends disagree on what it means.
    if idx.numel() < 2:
        return
    row_of = torch.repeat_interleave(torch.arange(ptr.numel() - 1), ptr[1:] - ptr[:-1])
    key = row_of * (int(idx.max()) + 1) + idx
    order = torch.argsort(key, stable=True)
    same = key[order][1:] == key[order][:-1]
    if bool(same.any()):
        at = int(order[1:][same][0])
        _fail(
            f"block_idx[{at}] = {int(idx[at])} repeats a page already listed for query "
            f"block {int(row_of[at])}"
        )


def to_padded(
    block_ptr: torch.Tensor, block_idx: torch.Tensor, width: int | None = None
) -> PaddedPages:
    """CSR page lists -> :class:`PaddedPages` on ``block_ptr``'s device.

    ``width`` fixes the padded width (default: the longest list); it must be >= every count.
    """
    ptr = block_ptr.to(torch.int64)
    counts = ptr[1:] - ptr[:-1]
    longest = int(counts.max()) if counts.numel() else 0
    width = longest if width is None else width
    if width < longest:
        raise ValueError(f"width={width} is shorter than the longest page list ({longest})")
    slot = torch.arange(width, device=ptr.device)
    is_listed = slot[None, :] < counts[:, None]
    if block_idx.numel() == 0:
        page_ids = torch.zeros(is_listed.shape, dtype=torch.int64, device=ptr.device)
    else:
        flat = (ptr[:-1, None] + slot[None, :]).clamp(max=block_idx.numel() - 1)
        page_ids = torch.where(is_listed, block_idx.to(torch.int64)[flat], 0)
    return PaddedPages(page_ids=page_ids, is_listed=is_listed, counts=counts)


def lists_to_csr(
    lists: list[list[int]], device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Python page lists (one per row, rows in ``b * n_q_blocks + j`` order) -> CSR.

    Returns ``(block_ptr, block_idx)``: int32 tensors on ``device``.
    """
    lengths = torch.tensor([0] + [len(pages) for pages in lists], dtype=torch.int64)
    block_ptr = torch.cumsum(lengths, 0).to(torch.int32)
    block_idx = torch.tensor([p for pages in lists for p in pages], dtype=torch.int32)
    return block_ptr.to(device), block_idx.to(device)
