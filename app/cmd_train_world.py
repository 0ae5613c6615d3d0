"""``worldstream train-world``: encode the dataset and each frame's spatial-memory base with the
trained autoencoder, then train the world model (resumable) with one
:class:`~engine.training.config.TrainConfig`: a preset (a shipped recipe) plus ``--set``."""

from __future__ import annotations

import json
from pathlib import Path

from worldstream.app import settings_cli, train_out


def register(sub) -> None:
    p = sub.add_parser("train-world", help="train the built-in world model on encoded latents")
    p.add_argument("--world", choices=("landscape", "avatar"), default=None,
                   help="the world to train on (default: the preset's; alone, that world's "
                        "first recipe)")
    p.add_argument("--preset", default=None,
                   help="a shipped recipe (engine.training.config.PRESETS; default: the "
                        "world's first, 'landscape' or 'avatar')")
    settings_cli.add_arguments(p)
    p.add_argument("--data", type=Path, default=None,
                   help="recorded episodes (the world's recorder shards; default: the world's)")
    p.add_argument("--vae", type=Path, default=None,
                   help="the trained autoencoder whose latents the model learns (default: the "
                        "world's assets vae/)")
    p.add_argument("--out", type=Path, default=None,
                   help="where the trained model and its train_config.json go (default: "
                        "runs/WORLD/transformer under the working folder; never the shipped "
                        "assets/ without --force). Its parent becomes a model folder for "
                        "`play --world WORLD --model-path PARENT` (the autoencoder and the "
                        "world's stream settings copied in where it has none)")
    p.add_argument("--run-dir", type=Path, default=None,
                   help="checkpoints, logs and latent caches (a run resumes from here; "
                        "default: runs/WORLD/world)")
    train_out.add_force(p)
    p.add_argument("--max-minutes", type=float, default=None, help="stop this call after N min")
    p.set_defaults(func=run)


def resolve_config(args):
    """The run's :class:`TrainConfig` from ``--preset``, ``--world`` and ``--set``;
    ValueError for an unknown preset or field, a bad value, or a world the preset is not for."""
    from worldstream.engine.training.config import PRESETS

    name = args.preset or args.world or "landscape"
    if name not in PRESETS:
        raise ValueError(f"--preset must be one of {tuple(PRESETS)}, got {name!r}")
    cfg = PRESETS[name]
    if args.world is not None and args.world != cfg.world:
        raise ValueError(f"--preset {name} trains world {cfg.world!r}, not {args.world!r}")
    return cfg.with_sets([s for s in args.sets if s != "help"])


def run(args) -> int:
    import dataclasses

    from worldstream.engine.training.config import PRESETS, TrainConfig

    cfg = resolve_config(args)  # a bad preset or setting: one line, exit 2, before any work
    if settings_cli.wants_help(args):
        preset = args.preset or args.world or "landscape"
        settings_cli.print_settings(TrainConfig, dataclasses.asdict(cfg),
                                    f"preset {preset}, then --set")
        print("\npresets: " + ", ".join(PRESETS))
        return 0

    from worldstream.engine.models.builtin.loading import load_autoencoder
    from worldstream.engine.training.latents import encode_shards
    from worldstream.engine.training.train_world import model_inputs, train_world
    from worldstream.engine.worlds.catalog import world

    spec = world(cfg.world)
    out = train_out.check_out(args.out or Path("runs", spec.name, "transformer"), args.force)
    run_dir = args.run_dir or Path("runs", spec.name, "world")
    skip_source, pose_path = model_inputs(cfg)
    shards, _ = spec.ensure_dataset(args.data)
    vae = args.vae or spec.assets / "vae"
    ae = load_autoencoder(vae)
    if out.resolve().parent != spec.assets.resolve():
        train_out.complete_model_folder(out.parent, vae, spec.assets)
    data = encode_shards(ae, shards, cfg.chunk_frames, cache=run_dir / "latents.pt",
                         prompts=spec.prompts, view_box=spec.view_box)
    if skip_source == "warped":  # the same frames' memory pictures, warped to their poses
        # NOTE: a second pass over the shards (the reconstructions the warp reads are encoded
        # again); once per run directory, then read from its cache
        warped = encode_shards(ae, shards, cfg.chunk_frames,
                               cache=run_dir / "latents_warped.pt", prompts=spec.prompts,
                               view_box=spec.view_box, base_warp=pose_path)
        data.skip = warped.base
    settings = _stream_settings(spec.name) if cfg.p_onpolicy > 0 else None
    result = train_world(cfg, data, out, run_dir, max_minutes=args.max_minutes, ae=ae,
                         shard_dirs=shards, settings=settings)
    print(json.dumps(result))
    return 0


def _stream_settings(name: str) -> dict:
    """The world's streaming settings (``BuiltinConfig`` keyword arguments) its on-policy
    rollouts run with, as the playground streams it: the avatar's shipped
    ``stream_config.json`` (guidance, dead zone, fresh noise); the landscape's are the
    config's defaults."""
    if name != "avatar":
        return {}
    from worldstream.engine.backends.builtin import BuiltinConfig
    from worldstream.engine.backends.settings import load_settings
    from worldstream.engine.worlds.catalog import world

    return load_settings(BuiltinConfig, world(name).assets)
