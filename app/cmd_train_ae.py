"""``worldstream train-ae``: record simulator data if missing, then train the autoencoder."""

from __future__ import annotations

import json
from pathlib import Path

from worldstream.engine.worlds.catalog import WORLDS, world


def register(sub) -> None:
    p = sub.add_parser("train-ae", help="train the built-in autoencoder on simulator frames")
    p.add_argument("--world", choices=tuple(WORLDS), default="landscape",
                   help="the world whose frames to train on (sets the defaults below)")
    p.add_argument("--data", type=Path, default=None,
                   help="dataset folder, recorded if missing (default: the world's)")
    p.add_argument("--out", type=Path, default=None, help="default: the world's assets vae/")
    p.add_argument("--run-dir", type=Path, default=Path("runs/ae"), help="checkpoints (resume)")
    p.add_argument(
        "--steps",
        type=int,
        default=2400,
        help="optimizer steps (resumes from the run's checkpoint)",
    )
    p.add_argument("--max-minutes", type=float, default=None, help="stop this call after N min")
    p.add_argument("--batch", type=int, default=16, help="frames per batch")
    p.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate")
    p.add_argument(
        "--seed", type=int, default=0, help="RNG seed of the initialisation and the batch order"
    )
    p.add_argument(
        "--decoder-only",
        action="store_true",
        help="tune only the decoder of the weights in --out (latents stay valid)",
    )
    p.add_argument("--init-from", type=Path, default=None,
                   help="warm-start a fresh run from a saved autoencoder folder")
    p.add_argument("--loss", choices=("l1+mse", "mse"), default="l1+mse",
                   help="reconstruction loss (mse: the objective PSNR measures)")
    p.add_argument("--ema", type=float, default=None, metavar="DECAY",
                   help="evaluate and save an EMA of the weights with this decay (e.g. 0.999)")
    p.set_defaults(func=run)


def run(args) -> int:
    from worldstream.engine.training.train_ae import train_ae

    if args.steps < 1 or args.batch < 1:
        raise ValueError("--steps and --batch must be >= 1")
    spec = world(args.world)
    shards, heldout = spec.ensure_dataset(args.data)
    result = train_ae(
        shards,
        heldout,
        args.out or spec.assets / "vae",
        args.run_dir,
        steps=args.steps,
        batch=args.batch,
        lr=args.lr,
        seed=args.seed,
        decoder_only=args.decoder_only,
        max_minutes=args.max_minutes,
        init_from=args.init_from,
        loss=args.loss,
        ema_decay=args.ema,
    )
    print(json.dumps(result))
    return 0
