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
    cfg = GameEvalConfig()
    if args.quick:
        cfg = dataclasses.replace(cfg, episodes=3, effect_states=8, free_play=600)
    result, (model_frames, env_frames) = evaluate(world, cfg)
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
        if "sheet" in saved:
            saved["sheet"] = os.path.relpath(Path(saved["sheet"]).resolve(),
                                             Path(folder).resolve())
        (Path(folder) / "eval.json").write_text(json.dumps(saved, indent=1) + "\n")
        result["card"] = str(write_card(Path(folder)))
    return result
