"""The public entry points: ``paged_attention`` (validate, pick a backend, run) and its
plan/run split ``plan_paged_attention`` -> :class:`PagedAttentionPlan` for calls that share
their page lists (every layer and denoising step of one forward batch)."""

from __future__ import annotations

import functools
import importlib.util
import math
import os
import shutil
from dataclasses import dataclass

import torch

from worldstream.kernels.page_lists import (
    PaddedPages,
    to_padded,
    validate_lists,
    validate_tensors,
)

BACKENDS = ("reference", "flex", "triton")
#: environment variable that forces the backend used when ``backend="auto"``
ENV_VAR = "WORLDSTREAM_ATTENTION"


@functools.cache
def _has_flex() -> bool:
    return importlib.util.find_spec("torch.nn.attention.flex_attention") is not None


@functools.cache
def _has_triton() -> bool:
    return importlib.util.find_spec("triton") is not None


@functools.cache
def _has_cxx() -> bool:
    # NOTE: cached: a PATH search per attention call costs a noticeable share of the call
    return bool(shutil.which("c++") or shutil.which("g++"))


def _triton_interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def available_backends(device: torch.device | str | None = None) -> list[str]:
    """Backends that can run on ``device`` (default: CUDA if present, else CPU).

    ``reference`` always; ``flex`` when FlexAttention exists (on CPU it also needs a C++
    compiler for inductor); ``triton`` on CUDA with triton installed, or on CPU only when
    ``TRITON_INTERPRET=1`` was set before import (a correctness mode, far slower).
    """
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    kind = torch.device(device).type
    found = ["reference"]
    if _has_flex() and (kind == "cuda" or _has_cxx()):
        found.append("flex")
    if _has_triton() and (kind == "cuda" or (kind == "cpu" and _triton_interpreted())):
        found.append("triton")
    return found


def resolve_backend(backend: str, device: torch.device) -> str:
    """Name of the backend ``backend`` stands for on ``device``.

    ``auto`` reads ``WORLDSTREAM_ATTENTION`` first; otherwise ``reference`` on every device:
    the fastest at the engine's shapes on the CPUs and GPUs it has run on, with no compile on
    first call (kernels/README.md). Raises ``ValueError`` for an unknown or unavailable
    name.
    """
    if backend == "auto":
        forced = os.environ.get(ENV_VAR, "").strip()
        if forced and forced != "auto":
            backend = forced
        else:
            return "reference"
    if backend not in BACKENDS:
        raise ValueError(f"unknown attention backend {backend!r}; choose from {BACKENDS} or 'auto'")
    if backend not in available_backends(device):
        raise ValueError(
            f"attention backend {backend!r} is not available on {device}; "
            f"available: {available_backends(device)}"
        )
    return backend


@dataclass(frozen=True)
class PagedAttentionPlan:
    """Page lists checked and laid out once for every attention call that shares them —
    FlashInfer's plan/run split (``BatchPrefillWithPagedKVCacheWrapper.plan`` once per batch,
    ``run`` per layer). Made by :func:`plan_paged_attention`; :meth:`run` only checks the
    query and pools against it (attribute reads), so the per-call cost is the attention.

    ``dense``: every list has the same length and every page is full, so no key is masked
    (the reference backend then calls SDPA without a mask).
    """

    block_ptr: torch.Tensor
    block_idx: torch.Tensor
    page_lens: torch.Tensor | None
    num_rows: int
    num_pages: int
    page_size: int
    q_block_size: int | None
    backend: str
    pages: PaddedPages | None  # padded form (reference and flex backends)
    dense: bool

    def run(
        self,
        q: torch.Tensor,
        k_pool: torch.Tensor,
        v_pool: torch.Tensor,
        *,
        scale: float | None = None,
    ) -> torch.Tensor:
        """Attention of ``q`` ``[B, H, Lq, D]`` over the planned lists in ``k_pool``/``v_pool``
        ``[P, H, page_size, D]`` (see :func:`paged_attention`); returns ``[B, H, Lq, D]`` in
        ``q.dtype``. ``ValueError`` when the tensors do not match each other or the plan
        (rows, pool size, page size, device)."""
        shape = validate_tensors(q, k_pool, v_pool, self.q_block_size)
        if shape.num_rows != self.num_rows:
            raise ValueError(
                f"the plan has {self.num_rows} query blocks, q has B * n_q_blocks = "
                f"{shape.num_rows}"
            )
        if (shape.num_pages, shape.page_size) != (self.num_pages, self.page_size):
            raise ValueError(
                f"the plan is for a pool of {self.num_pages} pages of {self.page_size} tokens, "
                f"got {shape.num_pages} of {shape.page_size}"
            )
        if q.device != self.block_ptr.device:
            raise ValueError(
                f"all tensors must be on one device, got q on {q.device} and the plan's lists "
                f"on {self.block_ptr.device}"
            )
        scale = 1.0 / math.sqrt(shape.head_dim) if scale is None else float(scale)
        if shape.num_rows == 0:
            return torch.zeros_like(q)
        if self.backend == "triton":
            from worldstream.kernels.triton_paged import triton_paged_attention

            return triton_paged_attention(
                q, k_pool, v_pool, self.block_ptr, self.block_idx, self.page_lens, scale, shape
            )
        assert self.pages is not None
        k_pool, v_pool = k_pool.contiguous(), v_pool.contiguous()
        if self.backend == "flex":
            from worldstream.kernels.flex import flex_paged_attention

            return flex_paged_attention(q, k_pool, v_pool, self.pages, self.page_lens, scale,
                                        shape)
        from worldstream.kernels.reference import reference_paged_attention

        return reference_paged_attention(q, k_pool, v_pool, self.pages, self.page_lens, scale,
                                         shape, dense=self.dense)


def plan_paged_attention(
    block_ptr: torch.Tensor,
    block_idx: torch.Tensor,
    *,
    num_pages: int,
    page_size: int,
    page_lens: torch.Tensor | None = None,
    q_block_size: int | None = None,
    backend: str = "auto",
) -> PagedAttentionPlan:
    """Check CSR page lists once (``block_ptr [rows + 1]``, ``block_idx [nnz]``, optional
    ``page_lens [num_pages]``, as :func:`paged_attention` takes them, for a pool of
    ``num_pages`` pages of ``page_size`` tokens) and resolve the backend on the lists' device.

    Raises ``ValueError`` for malformed lists (the messages of :func:`paged_attention`) or an
    unknown or unavailable backend.
    """
    num_rows = block_ptr.numel() - 1 if block_ptr.dim() == 1 else -1
    validate_lists(block_ptr, block_idx, page_lens, num_rows, num_pages, page_size)
    return _make_plan(block_ptr, block_idx, page_lens, num_rows, num_pages, page_size,
                      q_block_size, backend)


def _make_plan(block_ptr, block_idx, page_lens, num_rows, num_pages, page_size, q_block_size,
               backend) -> PagedAttentionPlan:
    """:func:`plan_paged_attention` for lists already validated."""
    name = resolve_backend(backend, block_ptr.device)
    pages = None if name == "triton" else to_padded(block_ptr, block_idx)
    dense = (
        page_lens is None
        and pages is not None
        and pages.page_ids.shape[1] > 0
        and bool(pages.is_listed.all())
    )
    return PagedAttentionPlan(block_ptr, block_idx, page_lens, num_rows, num_pages, page_size,
                              q_block_size, name, pages, dense)


def paged_attention(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    block_ptr: torch.Tensor,
    block_idx: torch.Tensor,
    *,
    page_lens: torch.Tensor | None = None,
    scale: float | None = None,
    q_block_size: int | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """Block-sparse attention of query blocks over lists of pages in a shared page pool.

    Args:
        q: ``[B, H, Lq, D]`` float32/bfloat16/float16 queries.
        k_pool, v_pool: ``[P, H, page_size, D]`` pages of keys/values, same dtype/device as
            ``q`` (a per-layer slice of a contiguous pool; a non-contiguous pool is copied).
        block_ptr: int32/int64 ``[B * n_q_blocks + 1]`` CSR row pointers,
            ``n_q_blocks = Lq // q_block_size``.
        block_idx: int32/int64 ``[nnz]`` page ids. Query block ``j`` of batch row ``b``
            (``r = b * n_q_blocks + j``) attends to every valid token of the pages
            ``block_idx[block_ptr[r]:block_ptr[r + 1]]``; their order does not matter, a page
            may appear once per list. An empty list gives zeros.
        page_lens: optional int32/int64 ``[P]``: valid tokens at the start of each page
            (default: every page full).
        scale: softmax scale (default ``1 / sqrt(D)``).
        q_block_size: query tokens per query block (default ``page_size``); must divide ``Lq``.
        backend: ``"auto"`` | ``"reference"`` | ``"flex"`` | ``"triton"``; with ``"auto"``
            the environment variable ``WORLDSTREAM_ATTENTION`` forces one.

    Returns:
        ``[B, H, Lq, D]`` in ``q.dtype``.

    Raises:
        ValueError: mismatched shapes, dtypes or devices; ``Lq`` not a multiple of
            ``q_block_size``; malformed ``block_ptr``; a page id out of range or repeated
            within a list (the message names the offending ``block_idx`` index and value);
            ``page_lens`` out of ``[0, page_size]``; an unknown or unavailable backend.
    """
    shape = validate_tensors(q, k_pool, v_pool, q_block_size)
    if {block_ptr.device, block_idx.device} != {q.device}:
        devices = {"q": q.device, "block_ptr": block_ptr.device, "block_idx": block_idx.device}
        raise ValueError(f"all tensors must be on one device, got {devices}")
    validate_lists(block_ptr, block_idx, page_lens, shape.num_rows, shape.num_pages,
                   shape.page_size)
    plan = _make_plan(block_ptr, block_idx, page_lens, shape.num_rows, shape.num_pages,
                      shape.page_size, q_block_size, backend)
    return plan.run(q, k_pool, v_pool, scale=scale)
