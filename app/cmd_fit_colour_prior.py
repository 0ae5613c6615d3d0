"""``worldstream fit-colour-prior``: fit the landscape's colour prior on training worlds (the
walks are :mod:`engine.training.colour_prior`'s constants, those of the shipped prior)."""

from __future__ import annotations

import json
from pathlib import Path

from worldstream.app import train_out
from worldstream.engine.models.builtin.colour_prior import FILENAME


def register(sub) -> None:
    p = sub.add_parser("fit-colour-prior",
                       help="fit the built-in landscape's colour prior on simulated walks")
    p.add_argument("--out", type=Path, default=Path("runs", "landscape", FILENAME),
                   help=f"where the prior is written (default: runs/landscape/{FILENAME}, "
                        "beside train-world's default model; never the shipped assets/ "
                        "without --force)")
    train_out.add_force(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from worldstream.engine.training.colour_prior import fit_shipped_prior

    train_out.check_out(args.out, args.force)
    prior = fit_shipped_prior()
    prior.save(args.out)
    print(json.dumps({"out": str(args.out), "view_weight": prior.view_weight,
                      "scene_means": prior.scene_means}))
    return 0
