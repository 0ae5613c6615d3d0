"""``worldstream train-world``: encode the dataset and each frame's spatial-memory base with the
trained autoencoder, then train the world model (resumable)."""

from __future__ import annotations

import json
from pathlib import Path


def register(sub) -> None:
    p = sub.add_parser("train-world", help="train the built-in world model on encoded latents")
    p.add_argument("--world", choices=("landscape", "avatar"), default="landscape",
                   help="the world to train on (sets the defaults of --data, --vae, --out)")
    p.add_argument("--data", type=Path, default=None,
                   help="recorded episodes (the world's recorder shards; default: the world's)")
    p.add_argument("--vae", type=Path, default=None,
                   help="the trained autoencoder whose latents the model learns (default: the "
                        "world's assets vae/)")
    p.add_argument("--out", type=Path, default=None,
                   help="where the trained world model is saved (default: the world's assets "
                        "transformer/)")
    p.add_argument(
        "--run-dir",
        type=Path,
        default=Path("runs/world"),
        help="checkpoints and logs (a run resumes from here)",
    )
    p.add_argument("--steps", type=int, default=6000, help="optimizer steps")
    p.add_argument(
        "--transposed-copies", action="store_true",
        help="train on each shard and on its copy seen with x and y swapped (the landscape "
             "only: a symmetry augmentation against a preferred axis in what the model draws)",
    )
    p.add_argument("--max-minutes", type=float, default=None, help="stop this call after N min")
    p.add_argument("--batch", type=int, default=16, help="clips per batch")
    p.add_argument("--frames", type=int, default=8, help="frames per training clip")
    p.add_argument(
        "--chunk-frames", type=int, default=1, help="frames the model generates per chunk"
    )
    p.add_argument("--dim", type=int, default=128, help="transformer width")
    p.add_argument("--depth", type=int, default=6, help="transformer blocks")
    p.add_argument("--heads", type=int, default=4, help="attention heads")
    p.add_argument("--lr", type=float, default=3e-4, help="AdamW learning rate")
    p.add_argument(
        "--ctx-sigma-max",
        type=float,
        default=0.3,
        help="largest noise level of the noise-augmented context",
    )
    p.add_argument(
        "--change-weight",
        type=float,
        default=None,
        help="extra loss weight where a frame differs from its memory base (default: the "
             "world's recipe, 0 for the landscape)",
    )
    p.add_argument(
        "--loss", choices=("mse", "l1"), default="mse",
        help="the error the model's x0 prediction is trained on: squared (the recipe) or "
             "absolute (its optimum a median, not a blend of what could be there)",
    )
    p.add_argument(
        "--ghost-weight", type=float, default=0.0, metavar="W",
        help="weight of the error along each frame's ghost direction (its memory base less "
             "the frame: the picture in memory blended in) beside the --loss (default 0)",
    )
    p.add_argument(
        "--ghost", type=float, default=0.0, metavar="P",
        help="fraction of training clips fed with their memory base blended into every frame "
             "(the loss still asks for the true frames): teaches a model to draw past the "
             "ghost of the memory picture its own frames carry (default 0)",
    )
    p.add_argument(
        "--pose-window-tolerance", type=float, default=None, metavar="T",
        help="with a rig-posed model (--pose-path, or a fine-tune of one): each frame attends "
             "only the earlier frames of its clip posed within T of it, as the avatar's "
             "streams run (BuiltinConfig.window_pose_tolerance; default: block-causal)",
    )
    p.add_argument(
        "--noise-correlation", type=float, default=0.0, metavar="C",
        help="share of the denoising noise's variance low-passed over --noise-scale latent px "
             "(engine.models.builtin.world_noise.correlated; saved in the model's config, the "
             "engine draws its noise the same way; default 0: white noise)",
    )
    p.add_argument(
        "--noise-scale", type=float, default=2.0, metavar="PX",
        help="standard deviation in latent px of the low-pass of --noise-correlation (default 2)",
    )
    p.add_argument(
        "--seed", type=int, default=0, help="RNG seed of the initialisation and the batch order"
    )
    p.add_argument(
        "--base-warp", default=None, metavar="NAME",
        help="warp of the memory bases (engine.worlds.catalog.BASE_WARPS: 'head', the avatar's "
             "head pose; or 'none'); default: the world's (none for both). Fine-tunes of a "
             "trained model (--onpolicy, --adversarial) keep that model's",
    )
    p.add_argument(
        "--skip-source", choices=("previous", "warped"), default=None,
        help="a second picture beside the memory base, mixed into the skip by a predicted map "
             "(WorldDiT skip_source): the frame before each chunk, or the memory picture warped "
             "to the --pose-path rig's pose (its bases encoded once more, cached in the run "
             "dir). --init-from a model without it starts with it at zero; fine-tunes "
             "(--onpolicy, --adversarial) keep the trained model's",
    )
    p.add_argument(
        "--skip-prior", type=float, default=0.0,
        help="offset of the --skip-source mixing map (WorldDiT skip_prior): 1.0 starts the model "
             "trusting its second source everywhere (default 0: the base)",
    )
    p.add_argument(
        "--skip-floor", type=float, default=None, metavar="F",
        help="lower bound of the --skip-source mixing map (WorldDiT skip_floor, in [0, 1]): "
             "each pixel at least F from the second source, so the memory base cannot come "
             "through the skip as a ghost (default: unbounded)",
    )
    p.add_argument(
        "--backdrop-fill", action="store_true",
        help="with --skip-source warped: show the world's background plate where a turn "
             "uncovers the scene, in the warped skip and in a --base-warp's bases "
             "(WorldDiT backdrop_fill; the avatar's plate is drawn by its simulator) instead "
             "of filling it from around",
    )
    p.add_argument(
        "--pose-path", default=None, metavar="NAME",
        help="condition each frame on the pose path of a rig (engine.worlds.catalog.BASE_WARPS: "
             "'head', the avatar's head eased toward the held keys; 'head_layer', the same pose "
             "with the head moved as a layer over the background; 'head_rig', each part of the "
             "character moved by the rig's own amount; 'head_rig_fit', the same with each "
             "character's hat, long hair, bun and face width read from its picture; "
             "'head_rig_bridge', the same with a glasses' bridge moved with the eyes; WorldDiT "
             "pose_path). "
             "Fine-tunes (--onpolicy, --adversarial) keep the trained model's",
    )
    p.add_argument(
        "--init-from",
        type=Path,
        default=None,
        help="warm-start a fresh run from a saved model folder",
    )
    onp = p.add_argument_group(
        "on-policy fine-tuning",
        "fine-tune --init-from on its own rollouts: memory bases built "
        "from the model's generated frames, targets from the simulator "
        "(engine.training.onpolicy; an experiment, see the model card)",
    )
    onp.add_argument(
        "--onpolicy",
        action="store_true",
        help="fine-tune on the model's own rollouts (needs --init-from)",
    )
    onp.add_argument(
        "--refresh-every",
        type=int,
        default=0,
        help="steps between rebuilding the rollout pool with the current weights (0: never)",
    )
    onp.add_argument(
        "--pool-episodes", type=int, default=96, help="recorded episodes rolled out per pool"
    )
    onp.add_argument(
        "--rollout-steps", type=int, default=4,
        help="denoising steps of the rollouts (1-4; the avatar's playground default is 2)",
    )
    onp.add_argument(
        "--p-onpolicy",
        type=float,
        default=0.5,
        help="fraction of each batch drawn from the rollout pool",
    )
    adv = p.add_argument_group(
        "adversarial fine-tuning",
        "fine-tune --init-from with a patch discriminator beside the recipe's squared error "
        "(engine.training.adversarial; an experiment, see the model card)",
    )
    adv.add_argument(
        "--adversarial",
        type=float,
        default=None,
        metavar="WEIGHT",
        help="weight of the generator's adversarial loss (needs --init-from)",
    )
    adv.add_argument(
        "--adversarial-min-pose",
        type=float,
        default=0.0,
        metavar="POSE",
        help="judge only frames whose rig pose is at least this far from rest (largest "
             "absolute yaw/pitch, 0-1; a model with a pose path: the avatar's turned heads)",
    )
    adv.add_argument(
        "--adversarial-box",
        type=int,
        nargs=4,
        default=None,
        metavar=("TOP", "LEFT", "HEIGHT", "WIDTH"),
        help="judge only this latent box of each frame (latent pixels; the avatar's head: "
             "2 4 24 24, the turn reader's crop)",
    )
    p.set_defaults(func=run)


def _base_warp(args, spec) -> str | None:
    """The run's base warp: ``--base-warp`` or the world's; ValueError for an unknown name, or
    for a fine-tune (``--onpolicy``, ``--adversarial``) whose model reads its bases otherwise
    (its weights keep their config)."""
    from worldstream.engine.models.builtin.world_dit import WorldDiT
    from worldstream.engine.worlds.catalog import BASE_WARPS

    name = spec.base_warp if args.base_warp is None else args.base_warp
    warp = None if name in (None, "none") else name
    if warp is not None and warp not in BASE_WARPS:
        raise ValueError(f"--base-warp must be 'none' or one of {tuple(BASE_WARPS)}, "
                         f"got {name!r}")
    if args.onpolicy or args.adversarial is not None:
        has = WorldDiT.load_config(args.init_from).get("base_warp")
        if has != warp:
            raise ValueError(f"{args.init_from} reads its memory bases with base warp {has!r}, "
                             f"this run with {warp!r}: give --base-warp {has or 'none'}")
    return warp


def run(args) -> int:
    from worldstream.engine.models.builtin.loading import load_autoencoder
    from worldstream.engine.models.builtin.world_dit import WorldDiT
    from worldstream.engine.training.data import transposed_shards
    from worldstream.engine.training.latents import encode_shards
    from worldstream.engine.training.train_world import train_world
    from worldstream.engine.worlds.catalog import BASE_WARPS, world

    if args.steps < 1 or args.batch < 1:
        raise ValueError("--steps and --batch must be >= 1")
    if args.onpolicy and args.init_from is None:
        raise ValueError("--onpolicy fine-tunes a trained model: give --init-from")
    if not 1 <= args.rollout_steps <= 4:
        raise ValueError(f"--rollout-steps must be in [1, 4], got {args.rollout_steps}")
    if not 0.0 <= args.p_onpolicy <= 1.0:
        raise ValueError(f"--p-onpolicy must be in [0, 1], got {args.p_onpolicy}")
    if args.adversarial is not None and (args.init_from is None or args.onpolicy):
        raise ValueError("--adversarial fine-tunes a trained model: give --init-from "
                         "(and not --onpolicy)")
    if args.adversarial is not None and args.adversarial < 0:
        raise ValueError(f"--adversarial must be >= 0, got {args.adversarial}")
    if args.adversarial is None and (args.adversarial_min_pose or args.adversarial_box):
        raise ValueError("--adversarial-min-pose and --adversarial-box choose what "
                         "--adversarial judges: give --adversarial")
    if not 0.0 <= args.adversarial_min_pose <= 1.0:
        raise ValueError(f"--adversarial-min-pose must be in [0, 1], got "
                         f"{args.adversarial_min_pose}")
    if (args.onpolicy or args.adversarial is not None) and (
            args.noise_correlation != 0.0 or args.noise_scale != 2.0):
        raise ValueError("--onpolicy and --adversarial keep the noise their model was trained "
                         "on: leave out --noise-correlation and --noise-scale")
    if not 0.0 <= args.noise_correlation < 1.0 or args.noise_scale <= 0:
        raise ValueError("--noise-correlation must be in [0, 1) and --noise-scale > 0, got "
                         f"{args.noise_correlation} and {args.noise_scale}")
    spec = world(args.world)
    warp = _base_warp(args, spec)
    if args.pose_path is not None and args.pose_path not in BASE_WARPS:
        raise ValueError(f"--pose-path must be one of {tuple(BASE_WARPS)}, got {args.pose_path!r}")
    if args.skip_prior != 0.0 and args.skip_source is None:
        raise ValueError("--skip-prior offsets the mixing map of a --skip-source")
    if args.skip_floor is not None and (args.skip_source is None
                                        or not 0.0 <= args.skip_floor <= 1.0):
        raise ValueError("--skip-floor bounds the mixing map of a --skip-source, in [0, 1]")
    if args.skip_source == "warped" and args.pose_path is None:
        raise ValueError("--skip-source warped warps to a rig's pose: give --pose-path")
    if args.backdrop_fill and (args.skip_source != "warped" or spec.backdrop is None):
        raise ValueError("--backdrop-fill needs --skip-source warped and a world with a "
                         f"background plate (world {spec.name!r} has "
                         f"{'one' if spec.backdrop is not None else 'none'})")
    if args.transposed_copies and not spec.transposable:
        raise ValueError(f"--transposed-copies: world {spec.name!r} is not the same seen with "
                         "x and y swapped")
    shards, _ = spec.ensure_dataset(args.data)
    if args.transposed_copies:  # recorded once beside the shards, then read from there
        shards = shards + transposed_shards(shards)
    ae = load_autoencoder(args.vae or spec.assets / "vae")
    out = args.out or spec.assets / "transformer"
    skip_source, pose_path = args.skip_source, args.pose_path
    backdrop_fill = args.backdrop_fill
    if args.onpolicy or args.adversarial is not None:  # a fine-tune keeps its model's inputs
        config = WorldDiT.load_config(args.init_from)
        skip_source, pose_path = config.get("skip_source"), config.get("pose_path")
        backdrop_fill = bool(config.get("backdrop_fill", False))
    # a base warp shows the plate where it uncovers the scene as the skip's warp does (the
    # engine warps both alike: BuiltinBackend._plan)
    base_backdrop = spec.backdrop if backdrop_fill and warp is not None else None
    # one cache per kind of bases (a run dir reused with other bases must not read stale ones)
    cache = ("latents_backdrop.pt" if base_backdrop
             else "latents_transposed.pt" if args.transposed_copies else "latents.pt")
    data = encode_shards(ae, shards, args.chunk_frames, cache=args.run_dir / cache,
                         prompts=spec.prompts, view_box=spec.view_box,
                         base_warp=warp, backdrop=base_backdrop)
    if skip_source == "warped":  # the same frames' memory pictures, warped to their poses
        # NOTE: a second pass over the shards (the reconstructions the warp reads are encoded
        # again); once per run directory, then read from its cache
        backdrop = spec.backdrop if backdrop_fill else None
        cache = "latents_warped_backdrop.pt" if backdrop_fill else "latents_warped.pt"
        warped = encode_shards(ae, shards, args.chunk_frames,
                               cache=args.run_dir / cache, prompts=spec.prompts,
                               view_box=spec.view_box, base_warp=pose_path, backdrop=backdrop)
        data.skip = warped.base
    # the settings every fine-tune of a trained model takes from the command line
    tuning = dict(steps=args.steps, lr=args.lr, ctx_sigma_max=args.ctx_sigma_max,
                  seed=args.seed, max_minutes=args.max_minutes)
    change_weight = spec.change_weight if args.change_weight is None else args.change_weight
    if args.onpolicy:
        from worldstream.engine.training.onpolicy import finetune_onpolicy

        result = finetune_onpolicy(
            data, ae, shards, args.init_from, out, args.run_dir,
            refresh_every=args.refresh_every, pool_episodes=args.pool_episodes,
            p_onpolicy=args.p_onpolicy, rollout_steps=args.rollout_steps,
            prompts=spec.prompts, settings=_stream_settings(spec.name),
            change_weight=change_weight, **tuning,
        )
        print(json.dumps(result))
        return 0
    if args.adversarial is not None:
        from worldstream.engine.training.adversarial import finetune_adversarial

        result = finetune_adversarial(
            data, args.init_from, out, args.run_dir, adv_weight=args.adversarial,
            batch=args.batch, frames=args.frames, change_weight=change_weight,
            judge_min_pose=args.adversarial_min_pose,
            judge_box=None if args.adversarial_box is None else tuple(args.adversarial_box),
            **tuning,
        )
        print(json.dumps(result))
        return 0
    result = train_world(
        data,
        out,
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
        view_box=spec.view_box,
        num_actions=spec.num_actions,
        action_factors=spec.action_factors,
        change_weight=change_weight,
        base_warp=warp,
        skip_source=args.skip_source,
        pose_path=args.pose_path,
        skip_prior=args.skip_prior,
        skip_floor=args.skip_floor,
        backdrop_fill=args.backdrop_fill,
        loss=args.loss,
        ghost_weight=args.ghost_weight,
        p_ghost=args.ghost,
        pose_window_tolerance=args.pose_window_tolerance,
        noise_correlation=args.noise_correlation,
        noise_scale=args.noise_scale,
    )
    print(json.dumps(result))
    return 0


def _stream_settings(name: str) -> dict:
    """The world's streaming settings (``BuiltinConfig`` keyword arguments) its on-policy
    rollouts run with, as the playground streams it: the avatar's guidance, dead zone and
    fresh noise; the landscape's are the config's defaults."""
    if name == "avatar":
        from worldstream.engine.backends.avatar import avatar_settings

        return avatar_settings()
    return {}
