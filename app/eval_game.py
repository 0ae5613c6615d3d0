"""``worldstream eval --env ID --model-path DIR`` (and ``--world pong``): a game world against
the game itself (``engine.evaluation.game.evaluate``)."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path


def run_game_eval(args) -> dict:
    """The metrics of the game world the arguments name; writes the sheet and, with
    ``--card``, ``eval.json`` and the model card into the world's folder."""
    from worldstream.engine.backends.game.world import shipped_folder
    from worldstream.engine.core.registry import GAME_WORLDS, is_factory_env
    from worldstream.engine.evaluation.game.evaluate import GameEvalConfig, evaluate
    from worldstream.engine.evaluation.game.played import PlayedConfig
    from worldstream.engine.evaluation.game.sheet import save_game_sheet
    from worldstream.engine.models.game.world import load_world

    env_id, folder = args.env, args.model_path
    if args.world in GAME_WORLDS:
        env_id = env_id or GAME_WORLDS[args.world]
        folder = folder or shipped_folder(GAME_WORLDS[args.world])
    if folder is None:
        raise ValueError("--env needs --model-path DIR (a folder from `worldstream train`)")
    world = load_world(folder, env_id=env_id)
    if env_id is None and is_factory_env(world.env_id):  # a folder is data, like a log
        raise ValueError(f"{folder} is a world of {world.env_id!r}, a module:factory: name it "
                         f"yourself with --env {world.env_id}")
    cfg, played_cfg = GameEvalConfig(), PlayedConfig()
    if args.quick:
        cfg = dataclasses.replace(cfg, episodes=3, effect_states=8, free_play=600)
        played_cfg = dataclasses.replace(played_cfg, seeds=3, seconds=20.0)
    if args.curve:
        return write_curve(world, Path(folder), played_cfg)
    result, plays = played_result(world, played_cfg)
    if args.card or args.played_sheet is not None:
        target = args.played_sheet if args.played_sheet not in (None, True) else \
            Path(folder) / "played.png"
        result["played_sheet"] = str(played_sheet(world, plays, played_cfg, target))
    if args.played_only:
        return result
    mid, (model_frames, env_frames) = evaluate(world, cfg)
    result = mid | result
    sheet = args.sheet
    if sheet is True or (sheet is None and args.card):
        sheet = Path(folder) / "rollout.png"
    if sheet is not None:
        title = (f"{world.env_id}: model (top) vs game (bottom) in free play, same held keys, "
                 "from one held-out start; moving objects outlined")
        result["sheet"] = str(save_game_sheet(model_frames, env_frames, sheet, title))
    if args.card:
        from worldstream.engine.training.game.card import write_card

        saved = dict(result)  # paths relative to the folder the record lies in
        for key in ("sheet", "played_sheet"):
            if key in saved:
                saved[key] = os.path.relpath(Path(saved[key]).resolve(),
                                             Path(folder).resolve())
        (Path(folder) / "eval.json").write_text(json.dumps(saved, indent=1) + "\n")
        result["card"] = str(write_card(Path(folder)))
    return result


def played_result(world, cfg) -> tuple[dict, dict]:
    """The as-played figures (rounded, JSON-ready) and the plays."""
    from worldstream.engine.evaluation.game.played import evaluate_played
    from worldstream.engine.worlds.game.env import GameEnv

    game = GameEnv(world.env_id, size=world.size)
    try:
        result, plays = evaluate_played(world, game, cfg)
    finally:
        game.close()
    return _json_ready(result), plays


def played_sheet(world, plays: dict, cfg, out: Path) -> Path:
    """The sheet from the reset of the first policy's first session."""
    from worldstream.engine.evaluation.game.sheet import save_played_sheet

    policy = cfg.policies[0]
    p = plays[policy]
    title = (f"{world.env_id} from the reset, {policy} policy, session seed {int(p.seeds[0])}: "
             "model (top) over game (bottom), one frame a second, same actions")
    return save_played_sheet(world.palette.decode(p.model[0]), world.palette.decode(p.game[0]),
                             out, title, cfg.fps, start=p.start + 1)


#: the figures the learning curve follows
CURVE_KEYS = ("played_objects_ratio", "played_motion_ratio", "played_control_ratio",
              "played_births_ratio", "played_score_changes_ratio", "played_first_birth_s")


def write_curve(world, folder: Path, cfg) -> dict:
    """As-played figures of each learning-curve snapshot (``folder/curve/step-N``) and of the
    folder's own weights: ``folder/curve.json`` and ``folder/curve.png``; the curve dict."""
    import json

    from worldstream.engine.models.game.world import load_world

    points = []
    snapshots = sorted((folder / "curve").glob("step-*")) if (folder / "curve").is_dir() else []
    training = json.loads((folder / "training.json").read_text()) \
        if (folder / "training.json").exists() else {}
    # a snapshot's record names its step; a run's last weights are its configured steps
    final = int(training.get("step") or training.get("config", {}).get("steps", 0)) or None
    for path, step in [*((p, int(p.name.split("-")[1])) for p in snapshots), (folder, final)]:
        w = world if path == folder else load_world(path, env_id=world.env_id)
        result, _ = played_result(w, cfg)
        points.append({"step": step, **{k: result.get(k) for k in
                                        (*CURVE_KEYS, "gt_played_first_birth_s")}})
    curve = {"env": world.env_id, "seeds": cfg.seeds, "seconds": cfg.seconds,
             "points": points}
    (folder / "curve.json").write_text(json.dumps(curve, indent=1) + "\n")
    _plot_curve(curve, folder / "curve.png")
    return curve


def _plot_curve(curve: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = [p for p in curve["points"] if p["step"]]
    fig, ax = plt.subplots(figsize=(6, 3.2))
    for key in CURVE_KEYS[:-1]:
        ax.plot([p["step"] for p in points], [p[key] if p[key] is not None else float("nan")
                                               for p in points], marker="o", label=key[7:])
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("training steps (batch 32)")
    ax.set_ylabel("model ÷ game, as played")
    ax.legend(fontsize=7)
    ax.set_title(f"{curve['env']}: as played from the reset, {curve['seeds']} sessions × "
                 f"{curve['seconds']:.0f} s per policy", fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)


def _json_ready(result: dict) -> dict:
    """JSON has no NaN: a figure without data is null; floats rounded."""
    def clean(v):
        if isinstance(v, float):
            return None if v != v else round(v, 4)
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items()}
        if isinstance(v, list):
            return [clean(x) for x in v]
        return v
    return {k: clean(v) for k, v in result.items()}
