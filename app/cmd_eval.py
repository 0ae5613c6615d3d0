"""``worldstream eval``: score the built-in model against the simulator's ground truth."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def register(sub) -> None:
    p = sub.add_parser("eval", help="evaluate the built-in model against the simulator")
    p.add_argument("--quick", action="store_true", help="fewer episodes (<= 2 minutes)")
    p.add_argument("--json", action="store_true", help="print only the JSON object")
    p.add_argument("--model-path", type=Path, default=None, help="default: assets/builtin")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--drift-steps", type=int, default=None)
    p.add_argument("--ctx-sigma", type=float, default=None,
                   help="context noise level (default: the model's streaming default)")
    p.add_argument("--ctx-noise", action=argparse.BooleanOptionalAction, default=None,
                   help="add real noise to the context (default: the streaming default)")
    p.add_argument("--window-chunks", type=int, default=3)
    p.add_argument("--memory-chunks", type=int, default=None)
    p.add_argument("--topk-pages", type=int, default=0)
    p.add_argument("--no-recache", action="store_true")
    p.set_defaults(func=run)


def run(args) -> int:
    import torch

    from engine.evaluation.run import evaluate
    from engine.generator import load_builtin_backend
    from engine.models.loading import BUILTIN_DIR

    if not 1 <= args.steps <= 4:
        raise ValueError("--steps must be in [1, 4]")
    torch.manual_seed(0)
    overrides = {k: v for k, v in {"ctx_sigma": args.ctx_sigma, "ctx_noise": args.ctx_noise}.items()
                 if v is not None}
    gen = load_builtin_backend(
        args.model_path or BUILTIN_DIR,
        window_chunks=args.window_chunks,
        memory_chunks=args.memory_chunks or max(args.window_chunks, 8),
        topk_pages=args.topk_pages,
        recache=not args.no_recache,
        **overrides,
    )
    result = evaluate(gen, quick=args.quick, steps=args.steps, drift_steps=args.drift_steps)
    result["settings"] = {"ctx_sigma": gen.config.ctx_sigma, "ctx_noise": gen.config.ctx_noise,
                          "window_chunks": args.window_chunks, "topk_pages": args.topk_pages,
                          "memory_chunks": gen.config.memory_chunks,
                          "recache": not args.no_recache}
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    return 0
