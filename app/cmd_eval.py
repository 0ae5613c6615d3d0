"""``worldstream eval``: score a built-in world model against its simulator's ground truth."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from worldstream.app import settings_cli

#: the side-by-side sheet: its action script, prompt and length
SHEET_ACTIONS = Path("assets/demo_actions.json")
SHEET_PROMPT = "a snowy forest"
SHEET_FRAMES = 240


def register(sub) -> None:
    from worldstream.engine.core.registry import WORLDS

    p = sub.add_parser("eval", help="evaluate a world model against its simulator or game")
    p.add_argument("--world", choices=WORLDS, default=None,
                   help="the world to evaluate (default landscape)")
    p.add_argument("--env", default=None,
                   help="a game's Gymnasium env id: evaluate --model-path against the game")
    p.add_argument("--card", action="store_true",
                   help="game worlds: write eval.json, the sheet and the model card into the "
                        "world's folder")
    p.add_argument("--model-path", type=Path, default=None,
                   help="weights folder (default: the world's assets)")
    p.add_argument("--steps", type=int, default=4, help="denoising steps per chunk (1-4)")
    p.add_argument("--quick", action="store_true",
                   help="fewer episodes (~200 s for the landscape on one CPU core)")
    p.add_argument("--json", action="store_true", help="print only the JSON object")
    settings_cli.add_arguments(p)
    p.add_argument("--sheet", type=Path, nargs="?", const=True, default=None,
                   help="also write the side-by-side sheet (model over simulator) to this PNG "
                        "(default: the world's assets rollout.png)")
    p.add_argument("--picture-sheet", type=Path, default=None,
                   help="also write the sheet of streams started from procedural photos "
                        "(landscape)")
    p.add_argument("--skip-metrics", action="store_true", help="only write the sheet(s)")
    p.add_argument("--played-only", action="store_true",
                   help="game worlds: only the as-played part (from the reset frame)")
    p.add_argument("--played-sheet", type=Path, nargs="?", const=True, default=None,
                   help="game worlds: the as-played sheet (model over game from the reset, "
                        "one frame a second) to this PNG (default: the folder's played.png)")
    p.add_argument("--curve", action="store_true",
                   help="game worlds: the as-played figures of each learning-curve snapshot "
                        "(DIR/curve/step-N) into DIR/curve.json and curve.png")
    p.set_defaults(func=run)


def run(args) -> int:
    import torch

    from worldstream.app.eval_game import run_game_eval
    from worldstream.engine.core.registry import GAME_WORLDS

    if args.env is not None or args.world in GAME_WORLDS:
        torch.manual_seed(0)
        result = run_game_eval(args)
        print(json.dumps(result) if args.json else json.dumps(result, indent=2))
        return 0
    args.world = args.world or "landscape"

    from worldstream.engine.core import registry
    from worldstream.engine.worlds.catalog import world

    # the evaluation measures the world's default model (its trained one)
    family = registry.model_family(registry.default_model(args.world), args.world)
    assert family is not None  # default_model names one of the world's rows
    if settings_cli.wants_help(args):
        return settings_cli.print_family_settings(family, args.world, args.model_path)
    if not 1 <= args.steps <= 4:
        raise ValueError("--steps must be in [1, 4]")
    overrides = settings_cli.family_overrides(family, args)
    torch.manual_seed(0)
    if args.sheet is True:
        args.sheet = world(args.world).assets / "rollout.png"
    result = (_avatar(args, overrides) if args.world == "avatar"
              else _landscape(args, overrides))
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    return 0


def _landscape(args, overrides: dict) -> dict:
    from worldstream.app.action_script import load_action_script
    from worldstream.engine.backends.builtin import load_builtin_backend
    from worldstream.engine.evaluation.run import evaluate
    from worldstream.engine.evaluation.sheet import save_sheet, side_by_side
    from worldstream.engine.models.builtin import text as text_encoder
    from worldstream.engine.models.builtin.loading import BUILTIN_DIR
    from worldstream.engine.worlds.scenes import palette as class_palette

    backend = load_builtin_backend(args.model_path or BUILTIN_DIR, **overrides)
    result = {}
    if args.sheet is not None:
        actions, switches = load_action_script(SHEET_ACTIONS).per_frame(SHEET_FRAMES)
        model, sim = side_by_side(backend, actions, SHEET_PROMPT, switches, steps=args.steps)
        title = (f'{SHEET_ACTIONS.name}, "{SHEET_PROMPT}": model (top) vs simulator '
                 f"(bottom), same actions, {args.steps} steps")
        # the boundary-density label reads one scene's terrain classes: a sheet that switches
        # scenes goes without it
        classes = (None if switches else
                   class_palette(text_encoder.scene_for_prompt(SHEET_PROMPT)))
        result["sheet"] = str(save_sheet(model, sim, args.sheet, title, classes=classes))
    if args.picture_sheet is not None:
        from worldstream.engine.evaluation.picture_start import photo_sheet

        result["picture_sheet"] = photo_sheet(backend, args.picture_sheet, steps=args.steps)
    if not args.skip_metrics:
        result.update(evaluate(backend, quick=args.quick, steps=args.steps))
    result["settings"] = _settings(backend.config)
    return result


def _avatar(args, overrides: dict) -> dict:
    from worldstream.engine.backends.avatar.backend import load_avatar_backend
    from worldstream.engine.evaluation.avatar import evaluate, save_avatar_sheet

    backend = load_avatar_backend(args.model_path, **overrides).builtin
    result = {}
    if args.sheet is not None:
        result["sheet"] = str(save_avatar_sheet(backend, args.sheet, steps=args.steps))
    if not args.skip_metrics:
        result.update(evaluate(backend, quick=args.quick, steps=args.steps))
    result["settings"] = _settings(backend.config)
    return result


def _settings(config) -> dict:
    """The evaluated settings, JSON-ready (the colour prior as a dict, dtypes as names)."""
    out = {}
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if dataclasses.is_dataclass(value):
            value = dataclasses.asdict(value)
        elif not isinstance(value, bool | int | float | str | list | tuple | dict | type(None)):
            value = str(value)
        out[f.name] = value
    return out
