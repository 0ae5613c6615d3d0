"""Triton backend: one program per (query tile, head) looping over its query block's page list.

Tutorial order: the kernel, then the launcher (asserts shapes/strides), then the entry point.
Online softmax in base 2 (``exp2`` with ``scale * log2(e)`` folded into the scores), fp32
accumulators, bf16/fp16/fp32 inputs. A query block longer than ``BLOCK_M`` is split into
several query tiles; each tile reads the same page list. Pages of any size are read in
``BLOCK_N``-token steps up to the page's valid length.

Triton 3.9 notes: ``tl.make_block_ptr`` no longer exists, so loads use pointer arithmetic;
under ``TRITON_INTERPRET=1`` (read at import time) a bf16 ``tl.dot`` is silently wrong, so
interpreted runs upcast the dot operands to fp32 (``UPCAST``).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from worldstream.kernels.page_lists import AttentionShape

_LOG2E = 1.4426950408889634
_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def _paged_attention_kernel(
    Q,
    K,
    V,
    Out,
    block_ptr,
    block_idx,
    page_lens,
    stride_qb,
    stride_qh,
    stride_ql,
    stride_kp,
    stride_kh,
    stride_ks,
    stride_vp,
    stride_vh,
    stride_vs,
    stride_ob,
    stride_oh,
    stride_ol,
    qk_scale,
    n_q_blocks,
    q_block_size,
    tiles_per_block,
    page_size,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_LENS: tl.constexpr,
    UPCAST: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    pid_m = tl.program_id(0)
    head = tl.program_id(1).to(tl.int64)
    row = pid_m // tiles_per_block
    tile = pid_m % tiles_per_block
    batch = (row // n_q_blocks).to(tl.int64)
    q_block = row % n_q_blocks

    offs_m = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    m_ok = offs_m < q_block_size
    d_ok = offs_d < HEAD_DIM
    q_pos = (q_block * q_block_size + offs_m).to(tl.int64)
    q_ptrs = Q + batch * stride_qb + head * stride_qh + q_pos[:, None] * stride_ql + offs_d[None, :]
    q = tl.load(q_ptrs, mask=m_ok[:, None] & d_ok[None, :], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    start = tl.load(block_ptr + row)
    end = tl.load(block_ptr + row + 1)
    for entry in range(start, end):
        page = tl.load(block_idx + entry).to(tl.int64)
        if HAS_LENS:
            n_valid = tl.load(page_lens + page).to(tl.int32)
        else:
            n_valid = page_size
        k_base = K + page * stride_kp + head * stride_kh
        v_base = V + page * stride_vp + head * stride_vh
        for s0 in range(0, n_valid, BLOCK_N):
            offs_n = s0 + tl.arange(0, BLOCK_N)
            n_ok = offs_n < n_valid
            kt = tl.load(
                k_base + offs_n[None, :] * stride_ks + offs_d[:, None],
                mask=n_ok[None, :] & d_ok[:, None],
                other=0.0,
            )  # [BLOCK_D, BLOCK_N]
            v = tl.load(
                v_base + offs_n[:, None] * stride_vs + offs_d[None, :],
                mask=n_ok[:, None] & d_ok[None, :],
                other=0.0,
            )  # [BLOCK_N, BLOCK_D]
            if UPCAST:
                kt = kt.to(tl.float32)
                v = v.to(tl.float32)
            scores = tl.dot(q, kt, input_precision=DOT_PRECISION) * qk_scale
            scores = tl.where(n_ok[None, :], scores, float("-inf"))
            # every step has >= 1 valid key, so m_new is finite and exp2 never sees inf - inf
            m_new = tl.maximum(m_i, tl.max(scores, 1))
            p = tl.math.exp2(scores - m_new[:, None])
            alpha = tl.math.exp2(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
            m_i = m_new

    # rows that saw no valid key (empty list) keep l_i == 0 and return zeros
    safe_l = tl.where(l_i > 0.0, l_i, 1.0)
    out = acc / safe_l[:, None]
    o_ptrs = (
        Out + batch * stride_ob + head * stride_oh + q_pos[:, None] * stride_ol + offs_d[None, :]
    )
    tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=m_ok[:, None] & d_ok[None, :])


def _launch(
    q, k_pool, v_pool, out, block_ptr, block_idx, page_lens, scale, shape: AttentionShape
) -> None:
    assert q.stride(3) == 1 and k_pool.stride(3) == 1 and v_pool.stride(3) == 1, "D must be dense"
    assert out.shape == q.shape and out.stride(3) == 1
    block_d = max(16, triton.next_power_of_2(shape.head_dim))
    block_m = min(128 if block_d <= 64 else 64, max(16, triton.next_power_of_2(shape.q_block_size)))
    block_n = min(64, max(16, triton.next_power_of_2(shape.page_size)))
    tiles = triton.cdiv(shape.q_block_size, block_m)
    grid = (shape.num_rows * tiles, shape.heads)
    has_lens = page_lens is not None
    _paged_attention_kernel[grid](
        q,
        k_pool,
        v_pool,
        out,
        block_ptr,
        block_idx,
        page_lens if has_lens else block_ptr,
        q.stride(0),
        q.stride(1),
        q.stride(2),
        k_pool.stride(0),
        k_pool.stride(1),
        k_pool.stride(2),
        v_pool.stride(0),
        v_pool.stride(1),
        v_pool.stride(2),
        out.stride(0),
        out.stride(1),
        out.stride(2),
        scale * _LOG2E,
        shape.n_q_blocks,
        shape.q_block_size,
        tiles,
        shape.page_size,
        HEAD_DIM=shape.head_dim,
        BLOCK_D=block_d,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        HAS_LENS=has_lens,
        UPCAST=_INTERPRETED,
        # NOTE: fp32 inputs would silently use TF32 tensor cores on GPU (~1e-3 error); ask for
        # IEEE fp32 so fp32 calls match the reference to 1e-5. bf16/fp16 ignore the choice.
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        num_warps=4 if block_m * block_d <= 64 * 64 else 8,
        num_stages=2,
    )


def triton_paged_attention(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    block_ptr: torch.Tensor,
    block_idx: torch.Tensor,
    page_lens: torch.Tensor | None,
    scale: float,
    shape: AttentionShape,
) -> torch.Tensor:
    """Paged attention with the Triton kernel; inputs already validated. ``[B, H, Lq, D]``."""
    q = q if q.stride(3) == 1 else q.contiguous()
    k_pool = k_pool if k_pool.stride(3) == 1 else k_pool.contiguous()
    v_pool = v_pool if v_pool.stride(3) == 1 else v_pool.contiguous()
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    if shape.num_rows and shape.q_len:
        _launch(q, k_pool, v_pool, out, block_ptr, block_idx, page_lens, scale, shape)
    return out
