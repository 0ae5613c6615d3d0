"""``worldstream fit-colour-prior``: fit the landscape's colour prior on training worlds."""

from __future__ import annotations

import json
from pathlib import Path

from worldstream.engine.models.builtin.colour_prior import FILENAME
from worldstream.engine.models.builtin.loading import BUILTIN_DIR


def register(sub) -> None:
    p = sub.add_parser("fit-colour-prior",
                       help="fit the built-in landscape's colour prior on simulated walks")
    p.add_argument("--worlds", type=int, default=20,
                   help="training world seeds 0..N-1 walked in every scene (default 20)")
    p.add_argument("--length", type=int, default=3000,
                   help="frames of each walk (the scene's mean is taken from frame "
                        "min(200, length / 2) on, past the start view)")
    p.add_argument("--far", type=int, default=100,
                   help="the walk's last N frames are the far ground")
    p.add_argument("--out", type=Path, default=BUILTIN_DIR / FILENAME,
                   help=f"where the prior is written (default: assets/builtin/{FILENAME})")
    p.set_defaults(func=run)


def run(args) -> int:
    from worldstream.engine.training.colour_prior import fit_colour_prior

    if args.worlds < 1:
        raise ValueError("--worlds must be >= 1")
    prior = fit_colour_prior(list(range(args.worlds)), length=args.length, far=args.far,
                             skip=min(200, args.length // 2))
    prior.save(args.out)
    print(json.dumps({"out": str(args.out), "view_weight": prior.view_weight,
                      "scene_means": prior.scene_means}))
    return 0
