"""``worldstream train-world``: encode the dataset and each frame's spatial-memory base with the
trained autoencoder, then train the world model (resumable)."""

from __future__ import annotations

import json
from pathlib import Path


def register(sub) -> None:
    p = sub.add_parser("train-world", help="train the built-in world model on encoded latents")
    p.add_argument("--data", type=Path, default=Path("data_v2"))
    p.add_argument("--vae", type=Path, default=Path("assets/builtin/vae"))
    p.add_argument("--out", type=Path, default=Path("assets/builtin/transformer"))
    p.add_argument("--run-dir", type=Path, default=Path("runs/world"))
    p.add_argument("--steps", type=int, default=6000)
    p.add_argument("--max-minutes", type=float, default=None, help="stop this call after N min")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--frames", type=int, default=8)
    p.add_argument("--chunk-frames", type=int, default=1)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--depth", type=int, default=6)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--ctx-sigma-max", type=float, default=0.3,
                   help="largest noise level of the noise-augmented context")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--init-from",
        type=Path,
        default=None,
        help="warm-start a fresh run from a saved model folder",
    )
    p.set_defaults(func=run)


def run(args) -> int:
    from engine.models.loading import load_autoencoder
    from engine.training.data import ensure_dataset
    from engine.training.latents import encode_shards
    from engine.training.train_world import train_world

    if args.steps < 1 or args.batch < 1:
        raise ValueError("--steps and --batch must be >= 1")
    shards, _ = ensure_dataset(args.data)
    ae = load_autoencoder(args.vae)
    data = encode_shards(ae, shards, args.chunk_frames, cache=args.run_dir / "latents.pt")
    result = train_world(
        data,
        args.out,
        args.run_dir,
        steps=args.steps,
        batch=args.batch,
        frames=args.frames,
        chunk_frames=args.chunk_frames,
        dim=args.dim,
        depth=args.depth,
        num_heads=args.heads,
        lr=args.lr,
        ctx_sigma_max=args.ctx_sigma_max,
        seed=args.seed,
        max_minutes=args.max_minutes,
        init_from=args.init_from,
    )
    print(json.dumps(result))
    return 0
