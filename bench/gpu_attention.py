"""GPU attention benchmark at Wan2.1-1.3B shapes: triton vs flex vs SDPA (<= 5 min on one H100).

    python -m bench gpu_attention --json gpu_attention.json      # on a CUDA machine
    python -m bench gpu_attention --dry-run                       # anywhere: print the plan
    python -m bench gpu_attention --device cpu --tokens-per-frame 64 --heads 2 --head-dim 32
                                                                  # CPU smoke run, tiny shapes

Shapes (defaults): 12 heads x 128 dims, 1560 tokens per latent frame (30 x 52 latents),
queries = one chunk of 3 latent frames (Lq = 4680), KV = 21 latent frames (the chunk included),
bf16. Pages are allocated in multiples of 128 slots (FlexAttention's block granularity) and
``page_lens`` marks the valid tokens, so every paged backend reads the same pool. Cases:

* ``dense``: every query frame attends all 21 frames. Baseline: SDPA without a mask (flash).
* ``frames``: frame pages, sink 3 + window 9 frames (12 of 21). SDPA gets a boolean mask.
* ``tiles``: pages are row bands of a frame (3 per frame, 520 tokens); a query band attends
  every band of the current chunk and, in the sink + window frames, bands at distance <= 1
  (sliding-tile-style spatial sparsity). SDPA gets a boolean mask.

Printed per case and backend: median ms of one attention call on a plan made beforehand (as
the engine runs its layers), effective TFLOP/s (4 * H * D * attended query-key pairs), speed
relative to dense unmasked SDPA, and the median ms of making the plan (once a chunk).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from worldstream.bench.common import hardware_info, time_call
from worldstream.kernels import available_backends, lists_to_csr, plan_paged_attention

FLEX_GRANULE = 128


@dataclass(frozen=True)
class Case:
    name: str
    page_tokens: int  # valid tokens per page
    lists: list[list[int]]  # one per query block; ids are logical page numbers
    q_block_tokens: int


def build_cases(args) -> list[Case]:
    """Page lists per case. Logical page ``f * per_frame + t`` = tile ``t`` of KV frame ``f``;
    query block ``i`` is tile ``i % per_frame`` of chunk frame ``i // per_frame`` (whose KV
    frame is ``kv_frames - chunk_frames + i // per_frame``)."""
    t, kv, chunk = args.tokens_per_frame, args.kv_frames, args.chunk_frames
    sink, window = args.sink_frames, args.window_frames
    kept_frames = sorted(set(range(min(sink, kv))) | set(range(max(kv - window, 0), kv)))
    cases = [
        Case("dense", t, [list(range(kv))] * chunk, t),
        Case("frames", t, [kept_frames] * chunk, t),
    ]
    bands = args.bands
    if t % bands == 0:
        lists = []
        for i in range(chunk * bands):
            band = i % bands
            pages = [f * bands + b for f in range(kv - chunk, kv) for b in range(bands)]
            pages += [
                f * bands + b
                for f in kept_frames
                if f < kv - chunk
                for b in range(bands)
                if abs(b - band) <= 1
            ]
            lists.append(sorted(pages))
        cases.append(Case("tiles", t // bands, lists, t // bands))
    return cases


def _flops(case: Case, args) -> float:
    pairs = sum(len(pages) for pages in case.lists) * case.q_block_tokens * case.page_tokens
    return 4.0 * args.heads * args.head_dim * pairs


def _run_case(case: Case, args, dtype, device) -> list[dict]:
    h, d = args.heads, args.head_dim
    ps_alloc = math.ceil(case.page_tokens / FLEX_GRANULE) * FLEX_GRANULE
    num_pages = max(max(pages) for pages in case.lists) + 1
    gen = torch.Generator(device="cpu").manual_seed(0)
    # pages live in the pool in shuffled order, as in a shared pool
    placement = torch.randperm(num_pages, generator=gen).to(device)
    k_pool = torch.randn(num_pages, h, ps_alloc, d, dtype=dtype, device=device)
    v_pool = torch.randn(num_pages, h, ps_alloc, d, dtype=dtype, device=device)
    page_lens = torch.full((num_pages,), case.page_tokens, dtype=torch.int32, device=device)
    q_len = len(case.lists) * case.q_block_tokens
    q = torch.randn(1, h, q_len, d, dtype=dtype, device=device)
    lists = [[int(placement[p]) for p in pages] for pages in case.lists]
    block_ptr, block_idx = lists_to_csr(lists, device)

    # dense layout of the same keys for SDPA: logical page order, valid tokens only
    dense_k = k_pool[placement][:, :, : case.page_tokens]  # logical p -> physical placement[p]
    dense_v = v_pool[placement][:, :, : case.page_tokens]
    dense_k = dense_k.transpose(0, 1).reshape(1, h, -1, d)
    dense_v = dense_v.transpose(0, 1).reshape(1, h, -1, d)
    mask = None
    if case.name != "dense":
        mask = torch.zeros(q_len, num_pages, case.page_tokens, dtype=torch.bool, device=device)
        for i, pages in enumerate(case.lists):
            rows = slice(i * case.q_block_tokens, (i + 1) * case.q_block_tokens)
            mask[rows, pages] = True
        mask = mask.reshape(1, 1, q_len, -1)

    calls = {"sdpa": lambda: F.scaled_dot_product_attention(q, dense_k, dense_v, attn_mask=mask)}
    plans = {}
    for backend in ("triton", "flex", "reference"):
        if backend in args.backends and backend in available_backends(device):
            # NOTE: the engine checks and lays out a chunk's page lists once and runs every
            # layer on that plan, so the two are timed apart (timed together, the planning
            # floor hides the kernels' differences)
            def plan(b=backend):
                return plan_paged_attention(
                    block_ptr, block_idx, num_pages=num_pages, page_size=ps_alloc,
                    page_lens=page_lens, q_block_size=case.q_block_tokens, backend=b)

            plans[backend] = plan
            made = plan()
            calls[backend] = lambda p=made: p.run(q, k_pool, v_pool)
    sync = torch.cuda.synchronize if device.type == "cuda" else None
    truth = calls["sdpa"]().float()
    rows = []
    for name, fn in calls.items():
        try:
            err = float((fn().float() - truth).abs().max())
            timing = time_call(fn, warmup=args.warmup, repeats=args.repeats, sync=sync)
        except Exception as exc:  # noqa: BLE001 - one backend failing must not lose the others
            first = (str(exc).strip().splitlines() or [""])[0][:300]
            print(f"{case.name} {name}: failed: {type(exc).__name__}: {first}")
            rows.append({"case": case.name, "backend": name,
                         "error": f"{type(exc).__name__}: {first}"})
            continue
        plan_ms = None
        if name in plans:  # what one chunk's planning costs, once for all its layers
            plan_ms = time_call(plans[name], warmup=1, repeats=args.repeats, sync=sync)
            plan_ms = plan_ms["median_ms"]
        rows.append(
            {
                "case": case.name,
                "backend": name,
                **timing,
                "plan_ms": plan_ms,
                "tflops": _flops(case, args) / timing["median_ms"] / 1e9,
                "max_abs_err_vs_sdpa": err,
                "attended_pages": sum(map(len, case.lists)),
                "q_len": q_len,
                "page_tokens": case.page_tokens,
                "page_alloc": ps_alloc,
            }
        )
    return rows


def parse_args(argv: list[str] | None):
    parser = argparse.ArgumentParser(
        prog="python -m bench gpu_attention",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--json", help="write results (and hardware info) to this file")
    parser.add_argument("--dry-run", action="store_true", help="print the plan, run nothing")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], default="bf16")
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--tokens-per-frame", type=int, default=1560)
    parser.add_argument("--chunk-frames", type=int, default=3)
    parser.add_argument("--kv-frames", type=int, default=21)
    parser.add_argument("--sink-frames", type=int, default=3)
    parser.add_argument("--window-frames", type=int, default=9)
    parser.add_argument("--bands", type=int, default=3, help="tile pages per frame")
    parser.add_argument(
        "--backends", nargs="+", default=["triton", "flex"], choices=["triton", "flex", "reference"]
    )
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args(argv)
    if args.chunk_frames > args.kv_frames:
        parser.error("--chunk-frames must not exceed --kv-frames")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cases = build_cases(args)
    for case in cases:
        print(
            f"case {case.name:6s}: {len(case.lists)} query blocks of {case.q_block_tokens} "
            f"tokens, {sum(map(len, case.lists))} page reads of {case.page_tokens} tokens, "
            f"{_flops(case, args) / 1e9:.1f} GFLOP"
        )
    if args.dry_run:
        return 0
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: use --dry-run, or --device cpu with small shapes")
        return 1
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    torch.manual_seed(0)
    rows = []
    for case in cases:
        rows.extend(_run_case(case, args, dtype, device))
    base = next(r["median_ms"] for r in rows if r["case"] == "dense" and r["backend"] == "sdpa")
    for row in rows:
        if "error" in row:
            continue
        row["speedup_vs_dense_sdpa"] = base / row["median_ms"]
        print(
            f"{row['case']:6s} {row['backend']:9s} {row['median_ms']:9.3f} ms "
            f"{row['tflops']:7.1f} TFLOP/s {row['speedup_vs_dense_sdpa']:6.2f}x vs dense SDPA "
            f"(max err {row['max_abs_err_vs_sdpa']:.1e})"
            + ("" if row["plan_ms"] is None else f", plan {row['plan_ms']:.3f} ms once a chunk")
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "suite": "gpu_attention",
                    "hardware": hardware_info(),
                    "args": vars(args),
                    "results": rows,
                },
                f,
                indent=2,
            )
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
