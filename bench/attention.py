"""CPU attention benchmark at the built-in model's shapes: dense masked SDPA vs the paged
``reference`` and ``flex`` backends, for several memory lengths and sparsities.

    python -m bench attention --json out.json [--memory 16 64 256] [--dtype fp32 bf16]

Shapes: 6 heads x 32 dims, pages of 64 tokens (one latent frame), a query chunk of 2 frames
(Lq = 128, two query blocks of one frame). The session's memory of M latent frames plus the
current chunk lies scattered in a pool twice its size. Sparsities per query block:
``full`` (every memory page), ``static`` (sink 1 + window 8 + stride 8), ``topk`` (sink 1 +
window 8 + top-8 older pages by mean-query . mean-key). The dense baseline holds the same
memory contiguously and expresses the sparsity as a boolean mask (its cost ignores sparsity);
``sdpa_unmasked`` is plain full attention over the memory. Ratios are dense masked time /
method time (> 1: faster than the dense masked baseline).
"""

from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from worldstream.bench.common import hardware_info, time_call  # noqa: E402
from worldstream.kernels import paged_attention, select_pages_topk, static_page_list  # noqa: E402
from worldstream.kernels.page_lists import lists_to_csr  # noqa: E402

HEADS, HEAD_DIM, PAGE_SIZE, CHUNK_FRAMES = 6, 32, 64, 2
SINK, WINDOW, STRIDE, TOP_K = 1, 8, 8, 8
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
METHODS = ("sdpa_dense_masked", "sdpa_unmasked", "reference", "flex")


def _page_lists(q, k_pool, table: list[int], sparsity: str) -> list[list[int]]:
    """One list per query block (2 per chunk); the chunk's own pages are always attended."""
    n_blocks = CHUNK_FRAMES
    if sparsity == "full":
        return [list(table)] * n_blocks
    if sparsity == "static":
        kept = static_page_list(table, sink_pages=SINK, window_pages=WINDOW, stride=STRIDE)
        return [kept] * n_blocks
    always = table[:SINK] + table[-WINDOW:]
    older = table[SINK:-WINDOW]
    ptr, idx = select_pages_topk(q, k_pool, [always], [older], TOP_K, PAGE_SIZE)
    return [idx[ptr[r] : ptr[r + 1]].tolist() for r in range(n_blocks)]


def _dense_mask(table: list[int], lists: list[list[int]]) -> torch.Tensor:
    """[1, 1, Lq, len(table) * PAGE_SIZE] bool: query block j sees the pages in lists[j]."""
    position = {page: i for i, page in enumerate(table)}
    mask = torch.zeros(1, 1, CHUNK_FRAMES * PAGE_SIZE, len(table) * PAGE_SIZE, dtype=torch.bool)
    for j, pages in enumerate(lists):
        for page in pages:
            i = position[page]
            mask[0, 0, j * PAGE_SIZE : (j + 1) * PAGE_SIZE, i * PAGE_SIZE : (i + 1) * PAGE_SIZE] = 1
    return mask


def run_case(memory: int, dtype_name: str, sparsity: str, repeats: int) -> list[dict]:
    dtype = DTYPES[dtype_name]
    gen = torch.Generator().manual_seed(memory)
    frames = memory + CHUNK_FRAMES
    num_pages = 2 * frames
    k_pool = torch.randn(num_pages, HEADS, PAGE_SIZE, HEAD_DIM, generator=gen).to(dtype)
    v_pool = torch.randn(num_pages, HEADS, PAGE_SIZE, HEAD_DIM, generator=gen).to(dtype)
    q = torch.randn(1, HEADS, CHUNK_FRAMES * PAGE_SIZE, HEAD_DIM, generator=gen).to(dtype)
    table = torch.randperm(num_pages, generator=gen)[:frames].tolist()  # time order
    lists = _page_lists(q, k_pool, table, sparsity)
    block_ptr, block_idx = lists_to_csr(lists)
    dense_k = k_pool[table].transpose(0, 1).reshape(1, HEADS, frames * PAGE_SIZE, HEAD_DIM)
    dense_v = v_pool[table].transpose(0, 1).reshape(1, HEADS, frames * PAGE_SIZE, HEAD_DIM)
    mask = _dense_mask(table, lists)

    calls = {
        "sdpa_dense_masked": lambda: F.scaled_dot_product_attention(
            q, dense_k, dense_v, attn_mask=mask
        ),
        "sdpa_unmasked": lambda: F.scaled_dot_product_attention(q, dense_k, dense_v),
        "reference": lambda: paged_attention(
            q, k_pool, v_pool, block_ptr, block_idx, backend="reference"
        ),
        "flex": lambda: paged_attention(q, k_pool, v_pool, block_ptr, block_idx, backend="flex"),
    }
    start = time.perf_counter()
    flex_out = calls["flex"]()
    first_flex_s = time.perf_counter() - start
    truth = calls["sdpa_dense_masked"]().float()
    max_err = {
        name: float((calls[name]().float() - truth).abs().max()) for name in ("reference", "flex")
    }
    del flex_out

    attended = sum(len(pages) for pages in lists) / len(lists)
    rows, base_ms = [], None
    for method in METHODS:
        timing = time_call(calls[method], warmup=2, repeats=repeats)
        base_ms = base_ms or timing["median_ms"]
        rows.append(
            {
                "memory_frames": memory,
                "dtype": dtype_name,
                "sparsity": sparsity,
                "attended_pages": attended,
                "total_pages": frames,
                "method": method,
                **timing,
                "speedup_vs_dense_masked": base_ms / timing["median_ms"],
                "max_abs_err_vs_dense": max_err.get(method),
                "first_call_s": first_flex_s if method == "flex" else None,
            }
        )
    return rows


def _print_table(rows: list[dict]) -> None:
    print(
        f"{'M':>4} {'dtype':>5} {'sparsity':>8} {'pages':>7} | "
        + " | ".join(f"{m:>17}" for m in METHODS)
        + " | flex 1st call"
    )
    keys = sorted(
        {(r["memory_frames"], r["dtype"], r["sparsity"]) for r in rows},
        key=lambda k: (k[1], k[0], k[2]),
    )
    for key in keys:
        group = {
            r["method"]: r for r in rows if (r["memory_frames"], r["dtype"], r["sparsity"]) == key
        }
        first = group["flex"]
        cells = " | ".join(
            f"{group[m]['median_ms']:7.2f}ms {group[m]['speedup_vs_dense_masked']:5.2f}x"
            for m in METHODS
        )
        print(
            f"{key[0]:>4} {key[1]:>5} {key[2]:>8} "
            f"{first['attended_pages']:>3.0f}/{first['total_pages']:<3} | "
            f"{cells} | {first['first_call_s']:.1f}s"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench attention",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--json", help="write results (and hardware info) to this file")
    parser.add_argument(
        "--memory",
        type=int,
        nargs="+",
        default=[16, 64, 256],
        help="memory lengths in latent frames",
    )
    parser.add_argument("--dtype", nargs="+", choices=sorted(DTYPES), default=["fp32", "bf16"])
    parser.add_argument(
        "--sparsity",
        nargs="+",
        choices=["full", "static", "topk"],
        default=["full", "static", "topk"],
    )
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads (default: torch's choice); use 1 on a busy machine",
    )
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    torch.manual_seed(0)
    rows = []
    for dtype_name in args.dtype:
        for memory in args.memory:
            for sparsity in args.sparsity:
                rows.extend(run_case(memory, dtype_name, sparsity, args.repeats))
    _print_table(rows)
    report = {
        "suite": "attention",
        "hardware": hardware_info(),
        "shapes": {
            "heads": HEADS,
            "head_dim": HEAD_DIM,
            "page_size": PAGE_SIZE,
            "q_len": CHUNK_FRAMES * PAGE_SIZE,
            "sink": SINK,
            "window": WINDOW,
            "stride": STRIDE,
            "top_k": TOP_K,
        },
        "results": rows,
    }
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
        print(f"wrote {args.json}")
    return 0
