"""``worldstream eval``: score the built-in model against the simulator's ground truth."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path


def _number_or(word: str, convert, valid, expected: str, bounds: str):
    """An argparse type: ``word`` itself, or a number read by ``convert`` for which ``valid``
    holds (``expected``/``bounds`` name them in the error); anything else is refused before a
    model loads."""

    def parse(text: str):
        if text == word:
            return text
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected {expected} or {word!r}, got {text!r}") from None
        if not valid(value):
            raise argparse.ArgumentTypeError(f"must be {bounds}, got {value}")
        return value

    return parse


#: ``--guidance-chunks``: a count of chunks >= 0, or ``all``
_guidance_chunks = _number_or("all", int, lambda v: v >= 0, "a count", ">= 0")
#: ``--steady-guidance-sigma``: a noise level in (0, 1], or ``off``
_steady_sigma = _number_or("off", float, lambda v: 0 < v <= 1, "a noise level", "in (0, 1]")


def register(sub) -> None:
    p = sub.add_parser("eval", help="evaluate the built-in model against the simulator")
    p.add_argument("--world", choices=("landscape", "avatar"), default="landscape",
                   help="the world to evaluate (avatar: engine.evaluation.avatar)")
    p.add_argument("--quick", action="store_true", help="fewer episodes (<= 2 minutes)")
    p.add_argument("--json", action="store_true", help="print only the JSON object")
    p.add_argument("--model-path", type=Path, default=None, help="default: assets/builtin")
    p.add_argument("--steps", type=int, default=4, help="denoising steps per chunk (1-4)")
    p.add_argument(
        "--drift-steps",
        type=int,
        default=None,
        help="denoising steps of the long drift rollouts (default: --steps)",
    )
    p.add_argument(
        "--ctx-sigma",
        type=float,
        default=None,
        help="context noise level (default: the model's streaming default)",
    )
    p.add_argument(
        "--ctx-noise",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="add real noise to the context (default: the streaming default)",
    )
    p.add_argument(
        "--window-chunks",
        type=int,
        default=None,
        help="chunks always attended (default: the model's streaming setting)",
    )
    p.add_argument(
        "--memory-chunks",
        type=int,
        default=None,
        help="chunks retained for sparse memory and rewind",
    )
    p.add_argument(
        "--topk-pages",
        type=int,
        default=None,
        help="older pages attended by key similarity (0 = off)",
    )
    p.add_argument(
        "--spatial-pages",
        type=int,
        default=None,
        help="older KV pages attended by camera overlap with the view",
    )
    p.add_argument(
        "--guidance",
        type=float,
        default=None,
        help="classifier-free guidance scale on the prompt after a switch (1 = off; default: "
        "the model's streaming default)",
    )
    p.add_argument(
        "--guidance-chunks",
        type=_guidance_chunks,
        default=None,
        help="chunks guided from a prompt switch, or 'all' for every chunk (default: the "
        "model's streaming default)",
    )
    p.add_argument(
        "--steady-guidance-sigma",
        type=_steady_sigma,
        default=None,
        help="outside the chunks guided after a switch, guide the prompt at the denoising "
        "steps whose noise level is at least this, or 'off' (default: the world's streaming "
        "default)",
    )
    p.add_argument(
        "--action-guidance",
        type=float,
        default=None,
        help="classifier-free guidance scale on the action against the neutral action (1 = off; "
        "default: the world's streaming default)",
    )
    p.add_argument(
        "--restyle-chunks",
        type=int,
        default=None,
        help="chunks from a prompt switch that restyle the view (default: the streaming default)",
    )
    p.add_argument(
        "--residual-deadzone",
        type=float,
        default=None,
        help="levels under which the model's change to a remembered pixel is dropped "
        "(soft threshold; 0 = off; default: the world's streaming default)",
    )
    p.add_argument(
        "--residual-gate",
        type=float,
        nargs=2,
        metavar=("T1", "T2"),
        default=None,
        help="levels of the model's change (averaged over 5 px) from which the frame fades "
        "from memory plus change to the model's decode, fully at T2 (default: the world's "
        "streaming default: the avatar's 32 80, none on the landscape)",
    )
    p.add_argument(
        "--no-residual-gate",
        action="store_true",
        help="switch the residual gate off (memory plus change wherever memory holds the pixel)",
    )
    p.add_argument(
        "--window-pose-tolerance",
        type=float,
        default=None,
        help="leave window frames posed farther than this from the new frame out of its "
        "attention (pose units, 1 = a full turn; a rig-posed model; default: the world's "
        "streaming default: the avatar's 0.0625); a negative value switches it off",
    )
    p.add_argument(
        "--last-step-cache-sigma",
        type=float,
        default=None,
        help="keep a chunk's last denoising step's keys/values as its cache entry (no cache "
        "fill) when that step's noise level is at most this (default: the streaming default, "
        "0.3: at 4 steps); a negative value switches it off (every chunk cache-filled)",
    )
    p.add_argument(
        "--first-step-from-memory",
        type=int,
        default=None,
        metavar="STEPS",
        help="in chunks of at least STEPS denoising steps the first step takes the memory "
        "base as its prediction instead of a forward (default: the world's streaming "
        "default: 4 for the landscape, off for the avatar); a negative value switches it off",
    )
    p.add_argument(
        "--refining-detail-cap",
        type=float,
        default=None,
        metavar="TIMES",
        help="limit the detail carried onto new ground being refined to TIMES what the "
        "autoencoder loses on the stream's real frames (default: the world's streaming "
        "default: 2 for the landscape, off for the avatar); a negative value switches it off",
    )
    p.add_argument(
        "--refining-detail-shading",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="keep the detail carried onto new ground being refined as shading of the "
        "decoded colour under it (default: the world's streaming default: on for the "
        "landscape, off for the avatar); --no-refining-detail-shading keeps its colour too",
    )
    p.add_argument(
        "--colour-anchor",
        type=float,
        default=None,
        metavar="LEVELS",
        help="shift generated ground whose running mean colour strays more than LEVELS from "
        "the stream's colour reference (default: the world's streaming default: 2 for the "
        "landscape, off for the avatar); a negative value switches it off",
    )
    p.add_argument(
        "--no-colour-prior",
        action="store_true",
        help="anchor colours to the stream's real frames' own mean, not shrunk toward the "
        "scene's (the landscape's colour_prior.json)",
    )
    p.add_argument(
        "--memory-settle-px",
        type=int,
        default=None,
        metavar="PX",
        help="new ground is rewritten by every frame until a frame has seen it PX pixels "
        "inside its border (default: the world's streaming default)",
    )
    p.add_argument(
        "--decode-refining",
        action="store_true",
        default=None,
        help="show the model's decode, not memory plus change, on new ground being refined",
    )
    p.add_argument(
        "--world-noise",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="initial noise read from a field fixed in world coordinates (default: the world's "
        "streaming default); --no-world-noise draws it afresh every chunk",
    )
    p.add_argument(
        "--world-noise-period",
        type=int,
        default=None,
        help="frames at rest over which the world noise field drifts, once the camera has "
        "rested longer than the hold (0 = fixed in time; default: the streaming default)",
    )
    p.add_argument(
        "--world-noise-hold",
        type=int,
        default=None,
        help="frames in a row a resting camera keeps the world noise field fixed before it "
        "drifts (default: the streaming default)",
    )
    p.add_argument(
        "--no-recache", action="store_true", help="do not recache the window after a prompt switch"
    )
    p.add_argument(
        "--sheet",
        type=Path,
        nargs="?",
        const=True,
        default=None,
        help="also write the side-by-side sheet (model over simulator) to this PNG (default: "
        "the world's assets rollout.png)",
    )
    p.add_argument(
        "--sheet-actions",
        type=Path,
        default=Path("assets/demo_actions.json"),
        help="action script of the side-by-side sheet",
    )
    p.add_argument(
        "--sheet-prompt", default="a snowy forest", help="prompt of the side-by-side sheet"
    )
    p.add_argument("--sheet-frames", type=int, default=240, help="frames on the side-by-side sheet")
    p.add_argument(
        "--picture-sheet",
        type=Path,
        default=None,
        help="also write the sheet of streams started from procedural photos to this PNG",
    )
    p.add_argument("--skip-metrics", action="store_true", help="only write the sheet(s)")
    p.set_defaults(func=run)


def run(args) -> int:
    import torch

    from worldstream.app.action_script import load_action_script
    from worldstream.engine.backends.builtin import load_builtin_backend
    from worldstream.engine.evaluation.run import evaluate
    from worldstream.engine.evaluation.sheet import save_sheet, side_by_side
    from worldstream.engine.models.builtin import text as text_encoder
    from worldstream.engine.models.builtin.loading import BUILTIN_DIR
    from worldstream.engine.worlds.scenes import palette as class_palette

    if not 1 <= args.steps <= 4:
        raise ValueError("--steps must be in [1, 4]")
    torch.manual_seed(0)
    settings = {
        "ctx_sigma": args.ctx_sigma,
        "ctx_noise": args.ctx_noise,
        "window_chunks": args.window_chunks,
        "memory_chunks": args.memory_chunks,
        "topk_pages": args.topk_pages,
        "spatial_pages": args.spatial_pages,
        "guidance": args.guidance,
        "guidance_chunks": args.guidance_chunks,
        "steady_guidance_sigma": args.steady_guidance_sigma,
        "restyle_chunks": args.restyle_chunks,
        "action_guidance": args.action_guidance,
        "residual_deadzone": args.residual_deadzone,
        "residual_gate": tuple(args.residual_gate) if args.residual_gate else None,
        "window_pose_tolerance": args.window_pose_tolerance,
        "last_step_cache_sigma": args.last_step_cache_sigma,
        "first_step_from_memory": args.first_step_from_memory,
        "refining_detail_cap": args.refining_detail_cap,
        "refining_detail_shading": args.refining_detail_shading,
        "colour_anchor": args.colour_anchor,
        "colour_prior": None,  # loaded with the weights; --no-colour-prior leaves it out
        "decode_refining": args.decode_refining,
        "memory_settle_px": args.memory_settle_px,
        "world_noise": args.world_noise,
        "world_noise_period": args.world_noise_period,
        "world_noise_hold": args.world_noise_hold,
        "recache": False if args.no_recache else None,
    }
    kwargs = {k: v for k, v in settings.items() if v is not None}
    if args.guidance_chunks == "all":
        kwargs["guidance_chunks"] = None  # BuiltinConfig: None guides every chunk
    if args.no_residual_gate:
        kwargs["residual_gate"] = None  # BuiltinConfig: None is off
    if args.window_pose_tolerance is not None and args.window_pose_tolerance < 0:
        kwargs["window_pose_tolerance"] = None
    if args.last_step_cache_sigma is not None and args.last_step_cache_sigma < 0:
        kwargs["last_step_cache_sigma"] = None
    if args.first_step_from_memory is not None and args.first_step_from_memory < 0:
        kwargs["first_step_from_memory"] = None
    for name in ("refining_detail_cap", "colour_anchor"):
        if settings[name] is not None and settings[name] < 0:
            kwargs[name] = None  # BuiltinConfig: None is off
    if args.no_colour_prior:
        kwargs["colour_prior"] = None  # BuiltinConfig: None is off
    if args.steady_guidance_sigma == "off":
        kwargs["steady_guidance_sigma"] = None  # BuiltinConfig: None is off
    if args.world == "avatar":
        return _run_avatar(args, kwargs, settings)
    if args.action_guidance is not None:
        from worldstream.engine.worlds.actions import IDLE

        kwargs["neutral_action"] = IDLE
    gen = load_builtin_backend(args.model_path or BUILTIN_DIR, **kwargs)
    result = {}
    if args.sheet is True:
        args.sheet = BUILTIN_DIR / "rollout.png"
    if args.sheet is not None:
        script = load_action_script(args.sheet_actions)
        actions, switches = script.per_frame(args.sheet_frames)
        model, sim = side_by_side(gen, actions, args.sheet_prompt, switches, steps=args.steps)
        title = (
            f'{args.sheet_actions.name}, "{args.sheet_prompt}": model (top) vs simulator '
            f"(bottom), same actions, {args.steps} steps"
        )
        # the boundary-density label reads one scene's terrain classes: a sheet that switches
        # scenes goes without it
        classes = (None if switches else
                   class_palette(text_encoder.scene_for_prompt(args.sheet_prompt)))
        result["sheet"] = str(save_sheet(model, sim, args.sheet, title, classes=classes))
    if args.picture_sheet is not None:
        from worldstream.engine.evaluation.picture_start import photo_sheet

        result["picture_sheet"] = photo_sheet(gen, args.picture_sheet, steps=args.steps)
    if not args.skip_metrics:
        result.update(
            evaluate(gen, quick=args.quick, steps=args.steps, drift_steps=args.drift_steps)
        )
    result["settings"] = _settings(gen.config, settings)
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    return 0


def _settings(config, names) -> dict:
    """The evaluated settings, JSON-ready (a dataclass value, the colour prior, as a dict)."""
    out = {}
    for name in names:
        value = getattr(config, name)
        out[name] = dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value
    return out


def _run_avatar(args, kwargs: dict, settings: dict) -> int:
    from worldstream.engine.backends.avatar import load_avatar_backend
    from worldstream.engine.evaluation.avatar import evaluate, save_avatar_sheet
    from worldstream.engine.worlds.catalog import world

    gen = load_avatar_backend(args.model_path, **kwargs).gen
    result = {}
    if args.sheet is True:
        args.sheet = world("avatar").assets / "rollout.png"
    if args.sheet is not None:
        result["sheet"] = str(save_avatar_sheet(gen, args.sheet, steps=args.steps))
    if not args.skip_metrics:
        result.update(evaluate(gen, quick=args.quick, steps=args.steps))
    result["settings"] = _settings(gen.config, settings)
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    return 0
