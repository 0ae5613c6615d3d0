"""``python -m bench gpu_train --minutes M --out DIR``: train a built-in world's weights within a
time limit, on CUDA when there is one, and leave them in ``DIR/vae`` and ``DIR/transformer``
ready to commit under the world's ``assets/`` folder.

It runs the same commands as on the CPU (``worldstream train-ae``, ``train-world``: resumable,
their checkpoints under ``DIR/runs``), so that a short lease of a GPU machine is spent training,
not typing. Two modes:

* from scratch (the default): the autoencoder, then the world model; the time limit is split
  between them by ``--ae-share``;
* a fine-tune: every argument after ``--`` goes to ``worldstream train-world`` as given, and
  when it sets ``init_from`` (``--preset`` of a fine-tune, or ``--set init_from=DIR``) the
  world's shipped autoencoder is kept (its latents are the ones the model was trained on) and
  the whole time limit goes to the world model.

    python -m bench gpu_train --write-text-table T.npz --world avatar   # where the text model is
    python -m bench gpu_train --world avatar --text-table T.npz --workers 12 --minutes 4 \\
        --out DIR -- --preset avatar-v2.7 --set init_from=assets/avatar/transformer \\
        --set batch=64 --set steps=100000

A GPU machine that carries only the repository lacks the text model (an 88 MB package), so the
world's prompt embeddings travel as a table (``--write-text-table`` here, ``--text-table``
there). ``--prepare-only`` records and encodes the data (the run's latent caches) and stops,
so that it can run beside other GPU work and the training proper starts on cached latents.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench gpu_train", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=None, help="wall-time limit of training")
    p.add_argument("--out", type=Path, default=None, help="weights go to OUT/{vae,transformer}")
    p.add_argument("--world", choices=("landscape", "avatar"), default="landscape")
    p.add_argument("--data", type=Path, default=None, help="default: the world's data folder")
    p.add_argument("--workers", type=int, default=1, help="processes recording the shards")
    p.add_argument("--text-table", type=Path, default=None,
                   help="prompt embeddings written by --write-text-table (no text model needed)")
    p.add_argument("--write-text-table", type=Path, default=None, metavar="FILE",
                   help="write the world's prompt embeddings to FILE and stop")
    p.add_argument("--prepare-only", action="store_true",
                   help="record and encode the data (the run's latent caches), then stop")
    p.add_argument("--ae-share", type=float, default=0.3, help="fraction for the autoencoder")
    p.add_argument("--ae-steps", type=int, default=20_000)
    p.add_argument("--world-steps", type=int, default=60_000)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("world_args", nargs="*", help="after --: arguments of worldstream train-world")
    args = p.parse_args(argv)

    from worldstream.app.cli import main as cli
    from worldstream.engine.models.builtin import text
    from worldstream.engine.worlds.catalog import world

    spec = world(args.world)
    if args.write_text_table is not None:
        text.write_table(args.write_text_table, spec.prompts)
        print(f"wrote {len(spec.prompts)} prompt embeddings to {args.write_text_table}")
        return 0
    if args.out is None or (args.minutes is None and not args.prepare_only):
        raise SystemExit("--out and --minutes are needed (or --write-text-table)")
    if (args.minutes is not None and args.minutes <= 0) or not 0 < args.ae_share < 1:
        raise SystemExit("--minutes must be > 0 and --ae-share in (0, 1)")
    if args.text_table is not None:
        text.use_table(args.text_table)
    t0 = time.perf_counter()
    data = args.data or spec.data
    spec.ensure_dataset(data, workers=args.workers)
    runs = args.out / "runs"
    fine_tune = _is_fine_tune(args.world_args)
    world_cmd = ["train-world", "--world", args.world, "--data", str(data),
                 "--run-dir", str(runs / "world"), "--out", str(args.out / "transformer")]
    if fine_tune:
        world_cmd += args.world_args
    else:
        if args.prepare_only:
            print(json.dumps({"recorded": str(data), "wall_min": _minutes(t0)}))
            return 0  # the latents depend on the autoencoder still to be trained
        ae_cmd = ["train-ae", "--world", args.world, "--data", str(data),
                  "--run-dir", str(runs / "ae"), "--out", str(args.out / "vae"),
                  "--set", f"steps={args.ae_steps}", "--set", f"batch={args.batch}"]
        _check(cli(ae_cmd + ["--max-minutes", str(args.minutes * args.ae_share)]))
        world_cmd += ["--vae", str(args.out / "vae"), "--set", f"steps={args.world_steps}",
                      "--set", f"batch={args.batch}", *args.world_args]
    if args.prepare_only:
        # NOTE: a zero time limit stops train-world before its first step, after the data is
        # encoded and cached in the run folder; the run then resumes at step 0 as if fresh
        _check(cli(world_cmd + ["--max-minutes", "0"]))
        print(json.dumps({"prepared": str(runs / "world"), "wall_min": _minutes(t0)}))
        return 0
    left = args.minutes - (time.perf_counter() - t0) / 60
    _check(cli(world_cmd + ["--max-minutes", str(max(left, 0.5))]))
    print(json.dumps({"out": str(args.out), "wall_min": _minutes(t0)}))
    return 0


def _is_fine_tune(world_args: list[str]) -> bool:
    """Whether train-world's arguments start from trained weights (``init_from`` set by the
    preset or by ``--set``)."""
    from worldstream.engine.training.config import PRESETS

    preset = None
    for flag, value in zip(world_args, world_args[1:]):
        if flag == "--preset":
            preset = value
        if flag == "--set" and value.startswith("init_from="):
            return value.split("=", 1)[1].lower() not in ("", "none", "null")
    return preset in PRESETS and PRESETS[preset].init_from is not None


def _check(code: int) -> None:
    if code != 0:  # the command printed its error
        raise SystemExit(code)


def _minutes(t0: float) -> float:
    return round((time.perf_counter() - t0) / 60, 2)


if __name__ == "__main__":
    raise SystemExit(main())
