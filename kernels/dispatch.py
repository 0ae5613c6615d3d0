"""The public ``paged_attention`` entry point: validate once, pick a backend, run it."""

from __future__ import annotations

import functools
import importlib.util
import math
import os
import shutil

import torch

from worldstream.kernels.page_lists import to_padded, validate_inputs

BACKENDS = ("reference", "flex", "triton")
#: environment variable that forces the backend used when ``backend="auto"``
ENV_VAR = "WORLDSTREAM_ATTENTION"


@functools.cache
def _has_flex() -> bool:
    return importlib.util.find_spec("torch.nn.attention.flex_attention") is not None


@functools.cache
def _has_triton() -> bool:
    return importlib.util.find_spec("triton") is not None


def _triton_interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def available_backends(device: torch.device | str | None = None) -> list[str]:
    """Backends that can run on ``device`` (default: CUDA if present, else CPU).

    ``reference`` always; ``flex`` when FlexAttention exists (on CPU it also needs a C++
    compiler for inductor); ``triton`` on CUDA with triton installed, or on CPU only when
    ``TRITON_INTERPRET=1`` was set before import (a correctness mode, ~30x slower).
    """
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    kind = torch.device(device).type
    found = ["reference"]
    if _has_flex() and (kind == "cuda" or shutil.which("c++") or shutil.which("g++")):
        found.append("flex")
    if _has_triton() and (kind == "cuda" or (kind == "cpu" and _triton_interpreted())):
        found.append("triton")
    return found


def resolve_backend(backend: str, device: torch.device) -> str:
    """Name of the backend ``backend`` stands for on ``device``.

    ``auto`` reads ``WORLDSTREAM_ATTENTION`` first; otherwise CUDA -> triton, CPU -> reference
    (measured on the 2-core dev CPU at the engine's shapes: as fast as or faster than compiled
    flex with sparse page lists, no compile on first call; see kernels/README.md). Raises
    ``ValueError`` for an unknown or unavailable name.
    """
    if backend == "auto":
        forced = os.environ.get(ENV_VAR, "").strip()
        if forced and forced != "auto":
            backend = forced
        else:
            usable = available_backends(device)
            if device.type == "cuda" and "triton" in usable:
                return "triton"
            return "reference"
    if backend not in BACKENDS:
        raise ValueError(f"unknown attention backend {backend!r}; choose from {BACKENDS} or 'auto'")
    if backend not in available_backends(device):
        raise ValueError(
            f"attention backend {backend!r} is not available on {device}; "
            f"available: {available_backends(device)}"
        )
    return backend


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
    shape = validate_inputs(q, k_pool, v_pool, block_ptr, block_idx, page_lens, q_block_size)
    name = resolve_backend(backend, q.device)
    scale = 1.0 / math.sqrt(shape.head_dim) if scale is None else float(scale)
    if shape.num_rows == 0:
        return torch.zeros_like(q)
    if name == "triton":
        from worldstream.kernels.triton_paged import triton_paged_attention

        return triton_paged_attention(
            q, k_pool, v_pool, block_ptr, block_idx, page_lens, scale, shape
        )
    k_pool, v_pool = k_pool.contiguous(), v_pool.contiguous()
    pages = to_padded(block_ptr, block_idx)
    if name == "flex":
        from worldstream.kernels.flex import flex_paged_attention

        return flex_paged_attention(q, k_pool, v_pool, pages, page_lens, scale, shape)
    from worldstream.kernels.reference import reference_paged_attention

    return reference_paged_attention(q, k_pool, v_pool, pages, page_lens, scale, shape)
