"""``worldstream train-ae``: record simulator data if missing, then train the autoencoder with
one :class:`~engine.training.config.AEConfig` (its defaults plus ``--set``)."""

from __future__ import annotations

import json
from pathlib import Path

from worldstream.app import settings_cli, train_out
from worldstream.engine.worlds.catalog import WORLDS, world


def register(sub) -> None:
    p = sub.add_parser("train-ae", help="train the built-in autoencoder on simulator frames")
    p.add_argument("--world", choices=tuple(WORLDS), default="landscape",
                   help="the world whose frames to train on (sets the defaults below)")
    p.add_argument("--data", type=Path, default=None,
                   help="dataset folder, recorded if missing (default: the world's)")
    p.add_argument("--out", type=Path, default=None,
                   help="where the weights and their train_config.json go (default: "
                        "runs/WORLD/vae under the working folder; never the shipped assets/ "
                        "without --force)")
    p.add_argument("--run-dir", type=Path, default=None,
                   help="checkpoints (resume; default: runs/WORLD/ae)")
    train_out.add_force(p)
    p.add_argument("--max-minutes", type=float, default=None, help="stop this call after N min")
    settings_cli.add_arguments(p)
    p.set_defaults(func=run)


def run(args) -> int:
    import dataclasses

    from worldstream.engine.training.config import AEConfig

    # validated before anything is recorded: a bad setting is one line, exit 2
    cfg = AEConfig().with_sets([s for s in args.sets if s != "help"])
    if settings_cli.wants_help(args):
        return settings_cli.print_settings(AEConfig, dataclasses.asdict(cfg), "--set")

    from worldstream.engine.training.train_ae import train_ae

    out = train_out.check_out(args.out or Path("runs", args.world, "vae"), args.force)
    run_dir = args.run_dir or Path("runs", args.world, "ae")
    spec = world(args.world)
    shards, heldout = spec.ensure_dataset(args.data)
    result = train_ae(shards, heldout, out, run_dir, cfg, max_minutes=args.max_minutes)
    print(json.dumps(result))
    return 0
