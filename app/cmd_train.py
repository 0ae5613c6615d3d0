"""``worldstream train --env ID --out DIR``: one recipe for every game (``GameTrainConfig``;
its defaults plus ``--set``). Records play when no ``--data`` is given; run it again to resume
(SIGTERM or Ctrl-C stop it after the step in flight, with its checkpoint written)."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

from worldstream.app import settings_cli, train_out


def register(sub) -> None:
    p = sub.add_parser("train", help="train a game's world model (any Gymnasium env with image "
                                     "observations and discrete actions); the default 1,400 "
                                     "steps take about an hour on two CPU cores, --set "
                                     "steps=N trains longer (the shipped cards' learning "
                                     "curves show what it buys)")
    p.add_argument("--env", required=True, help="Gymnasium env id (ALE/Pong-v5, "
                   "VizdoomBasic-v1, CrafterReward-v1) or module:factory")
    p.add_argument("--out", type=Path, required=True,
                   help="the world's folder (weights, config, model card; checkpoint.pt while "
                        "training: the same command resumes); never the shipped assets/ "
                        "without --force")
    train_out.add_force(p)
    p.add_argument("--data", type=Path, default=None,
                   help="a recording (`worldstream record`); default: record into OUT/data")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="where to train (default cpu; cuda does the same recipe faster)")
    settings_cli.add_arguments(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from worldstream.engine.training.game.train import GameTrainConfig

    cfg = dataclasses.replace(
        GameTrainConfig(), **settings_cli.overrides(GameTrainConfig, args),
        env=args.env, out=str(args.out), data=str(args.data or ""), device=args.device)
    if settings_cli.wants_help(args):
        return settings_cli.print_settings(GameTrainConfig, dataclasses.asdict(cfg), "--set")
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ValueError("--device cuda: no CUDA device here")
    train_out.check_out(args.out, args.force)
    from worldstream.engine.training.game.card import write_card
    from worldstream.engine.training.game.train import Stopped, train
    from worldstream.engine.worlds.game.env import GameEnv

    GameEnv(args.env, size=cfg.size).close()  # a bad id is one line before anything is written
    out = Path(cfg.out)
    try:
        train(cfg)
    except Stopped as stopped:  # a session's end: nothing lost, the same command resumes
        _portable_snapshots(out)
        print(f"worldstream train: {stopped}", file=sys.stderr)
        return 128 + stopped.signum
    _portable_snapshots(out)
    train_out.portable_record(out)
    write_card(Path(cfg.out))
    print(json.dumps(json.loads((Path(cfg.out) / "training.json").read_text())))
    return 0


def _portable_snapshots(out: Path) -> None:
    """The learning-curve snapshots' records name no machine path either (a snapshot ships
    as a world of its own)."""
    for record in sorted(out.glob("curve/step-*/training.json")):
        train_out.portable_record(record.parent)
