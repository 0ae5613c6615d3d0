"""``python -m bench gpu_train --minutes M --out DIR``: reproduce the built-in model's weights
within a time limit, on CUDA when there is one (the GPU machine is ~100x this CPU), and leave
them in ``DIR/vae`` and ``DIR/transformer`` ready to commit under ``assets/builtin``.

The same commands as on the CPU (``worldstream train-ae``, ``train-world``: resumable, their
checkpoints under ``DIR/runs``); the time limit is split between them by ``--ae-share``. It is
a prepared script so that a short lease of a GPU machine is spent training, not typing.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from worldstream.engine.training.data import ensure_dataset


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench gpu_train", description=__doc__)
    p.add_argument("--minutes", type=float, required=True, help="wall-time limit of training")
    p.add_argument("--out", type=Path, required=True, help="weights go to OUT/{vae,transformer}")
    p.add_argument("--data", type=Path, default=Path("data_v2"))
    p.add_argument("--ae-share", type=float, default=0.3, help="fraction for the autoencoder")
    p.add_argument("--ae-steps", type=int, default=20_000)
    p.add_argument("--world-steps", type=int, default=60_000)
    p.add_argument("--batch", type=int, default=64)
    args = p.parse_args(argv)
    if args.minutes <= 0 or not 0 < args.ae_share < 1:
        raise SystemExit("--minutes must be > 0 and --ae-share in (0, 1)")
    from worldstream.engine.models.builtin.loading import load_autoencoder
    from worldstream.engine.training.latents import encode_shards
    from worldstream.engine.training.train_ae import train_ae
    from worldstream.engine.training.train_world import train_world

    t0 = time.perf_counter()
    shards, heldout = ensure_dataset(args.data)
    runs = args.out / "runs"
    ae = train_ae(shards, heldout, args.out / "vae", runs / "ae", steps=args.ae_steps,
                  batch=args.batch, max_minutes=args.minutes * args.ae_share)
    data = encode_shards(load_autoencoder(args.out / "vae"), shards, 1, runs / "latents.pt")
    left = args.minutes - (time.perf_counter() - t0) / 60
    world = train_world(data, args.out / "transformer", runs / "world", steps=args.world_steps,
                        batch=args.batch, max_minutes=max(left, 1.0))
    print(json.dumps({"autoencoder": ae, "world": world,
                      "wall_min": round((time.perf_counter() - t0) / 60, 1)}))
    return 0
