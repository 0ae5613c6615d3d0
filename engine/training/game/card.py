"""The model card of a trained game world (Hugging Face's section order, under 100 lines),
generated from the folder's ``training.json``, ``world.json`` and, once evaluated,
``eval.json``."""

from __future__ import annotations

import json
import os
from pathlib import Path

from worldstream.engine.core.reader import MAX_META_BYTES, read_json_file

#: (key, label, ground-truth twin key, baseline key) of the evaluation table
ROWS = (
    ("teacher_forced_psnr_db", "teacher-forced PSNR, whole frame (dB)",
     "gt_teacher_forced_psnr_db",
     "copylast_tf_psnr_db"),
    ("changed_psnr_db", "teacher-forced PSNR, changed pixels (dB)", "gt_changed_psnr_db",
     "copylast_changed_psnr_db"),
    ("rollout_psnr_db_16", "free-rollout PSNR at 16 frames (dB)", "gt_rollout_psnr_db_16",
     "copylast_psnr_db_16"),
    ("rollout_psnr_db_64", "free-rollout PSNR at 64 frames (dB)", "gt_rollout_psnr_db_64",
     "copylast_psnr_db_64"),
    ("action_effect_corr", "action effect correlation, 1 frame", "gt_action_effect_corr", None),
    ("action_effect_corr_4", "action effect correlation, 4 frames", "gt_action_effect_corr_4",
     None),
    ("off_palette_share", "off-palette share, worst 100 frames", "gt_off_palette_share", None),
    ("change_rate_ratio", "free play: frame-change rate / the game's", "gt_change_rate_ratio",
     None),
    ("objects_ratio", "free play: moving objects per frame / the game's", "gt_objects_ratio",
     None),
    ("births_ratio", "free play: object births per 100 frames / the game's",
     "gt_births_ratio", None),
    *((f"object_{kind}_{n}", f"object {kind} at {n} frame{'s' if n > 1 else ''} (matched one "
       "to one)",
       f"gt_object_{kind}_{n}", f"copylast_object_{kind}_{n}")
      for n in (1, 4, 16) for kind in ("recall", "precision")),
)


#: (label, model key, game key, ratio key) of the as-played table
PLAYED_ROWS = (
    ("moving objects per frame, the colour class farthest from the game's", None, None,
     "played_objects_ratio"),
    ("how far each moving colour class goes per frame (a marching formation, a ball in play), "
     "the class farthest from the game's", None, None, "played_motion_ratio"),
    ("share of frames showing what the keys move", "played_control", "gt_played_control",
     "played_control_ratio"),
    ("objects appearing per 100 frames", "played_births_per_100", "gt_played_births_per_100",
     "played_births_ratio"),
    ("seconds from the first frame to the first appearance away from the keys' object (the serve)",
     "played_first_birth_s", "gt_played_first_birth_s", None),
    ("score changes per session", "played_score_changes", "gt_played_score_changes",
     "played_score_changes_ratio"),
    ("pixels cleared for good per session (bricks, enemies)", "played_cleared_px",
     "gt_played_cleared_px", "played_cleared_ratio"),
)


def _played_lines(evaluation: dict, folder: Path, samples: bool) -> list[str]:
    """The as-played table (and its sheet and learning curve where the folder has them);
    ``samples``: the world draws each frame's outcome."""
    if "played_objects_ratio" not in evaluation:
        return []
    lines = [
        f"**As played**, from the reset frame a session starts at: "
        f"{evaluation.get('played_seeds')} sessions × {evaluation.get('played_seconds'):.0f} s "
        f"for each player ({', '.join(evaluation.get('played_policies', []))}), the game and "
        "the world driven by the same keys"
        + ("; the world draws each frame's outcome from the session's seed" if samples else "")
        + ". Model and game: the players' mean; model ÷ game: the player farther from 1.",
        "",
        "| measure | model | game | model ÷ game |",
        "|---|---|---|---|",
    ]
    lines += [f"| {label} | {_cell(evaluation, m)} | {_cell(evaluation, g)} | "
              f"{_cell(evaluation, r)} |" for label, m, g, r in PLAYED_ROWS]
    if (folder / "played.png").exists():
        lines += ["", "![model over game from the reset, one frame a second](played.png)"]
    if (folder / "curve.png").exists():
        lines += ["", "Learning curve (as played, model ÷ game against training steps):", "",
                  "![learning curve](curve.png)"]
    return lines + ["", "**Mid-episode**, from held-out states 20-300 frames into an episode:",
                    ""]


def _cell(data: dict, key: str | None) -> str:
    if key is None or key not in data:
        return "—"
    value = data[key]
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def write_card(folder: Path) -> Path:
    """(Re)write ``folder/MODEL_CARD.md``; its path."""
    training = read_json_file(folder / "training.json", MAX_META_BYTES)
    world = read_json_file(folder / "world.json", MAX_META_BYTES)
    cfg = training["config"]
    evaluation = (read_json_file(folder / "eval.json", MAX_META_BYTES)
                  if (folder / "eval.json").exists() else None)
    unet = read_json_file(folder / "unet" / "config.json", MAX_META_BYTES)
    lines = [
        f"# Game world: {world['env']}",
        "",
        "## Model details",
        f"- A world model of the Gymnasium game `{world['env']}`: the next {world['size']}×"
        f"{world['size']} frame predicted as one of the game's {len(world['palette'])} "
        f"palette colours per pixel, from the last {unet['context']} frames and the actions.",
        f"- Network: a U-Net (widths {unet['channels']}), actions through adaptive group norm; "
        "one forward per frame, decoded by the most likely colour.",
        "- Trained by `worldstream train` (engine/training/game/train.py); no per-game code.",
        "",
        "## Uses",
        f"`worldstream play --env {world['env']} --model-path {_shown(folder)}` plays it in the "
        "browser; keys: the folder's `keymap.json` or the key map derived from the env's "
        "action meanings. Not for anything but play and study of the game.",
        "",
        "## Training data",
        f"{training['frames']} frames of the game " + (
            "played as a person does (taps, holds, pauses, the start action at each episode's "
            "start and after each lost ball), episodes cut at 150–2,000 frames so the recording "
            "holds many starts" if training.get("policy") == "player" else
            "played by a held-key policy (keys held 3–30 frames, pauses, the start action at "
            "each episode's start)")
        + f", episode seeds below 1,000,000; env settings {_settings(world['env'])}.",
        "",
        "## Training procedure",
        "```bash",
        *chain(training, folder),
        "```",
        "",
        (f"{training['step']:,} of {cfg['steps']:,} steps"
         if training.get("step", cfg["steps"]) != cfg["steps"] else f"{cfg['steps']:,} steps")
        + f" of {cfg['batch']} clips, {cfg['unroll']} frames predicted in a row from the model's "
        f"own previous predictions, changed pixels weighted ×{cfg['change_weight']:g}, context "
        f"corruption up to {cfg.get('corrupt', 0):.0%} of pixels in half the clips, "
        + (f"an outcome code of {cfg['code_grid']}×{cfg['code_grid']} cells × "
           f"{cfg['code_classes']} values per frame drawn from a posterior that sees the true "
           "frame, its prior trained on the "
           f"balanced KL (×{cfg['kl_weight']:g}, {cfg['kl_free']:g} free nats) and sampled at "
           f"play (dropped in {cfg['code_drop']:.0%}, a prior draw in {cfg['code_mix']:.0%} "
           f"of frames), pixels past {cfg['loss_cutoff']:g} nats left out, "
           if cfg.get("code_grid") else "")
        + (f"a {cfg['latent_dim']}-dim latent per frame inferred from the true frame (KL "
           f"×{cfg['kl_weight']:g}, {cfg['kl_free']:g} free nats; play feeds its prior mean), "
           if cfg.get("latent_dim") else "")
        + f"AdamW {cfg['lr']:g}, EMA {cfg['ema']}; {training['train_seconds'] / 60:.0f} min of "
        f"training on {_machine(training)}"
        + (f" at commit {training['commit']}" if training.get("commit") else "")
        + (f"; {training['weights']}." if training.get("weights") else "."),
        "",
        "## Evaluation",
    ]
    if evaluation is None:
        lines.append(f"Not evaluated yet: `worldstream eval --env {world['env']} --model-path "
                     f"{_shown(folder)} --card`.")
    else:
        lines += _played_lines(evaluation, folder, bool(unet.get("code_grid")))
        lines += [
            f"`worldstream eval --env {world['env']} --model-path DIR` on "
            f"{evaluation.get('held_out_episodes', '?')} held-out episodes (seeds no recording "
            "used); the game against itself is the ground-truth twin, holding the last true "
            "frame the copy-last baseline.",
            "",
            "| measure | model | game vs itself | copy-last |",
            "|---|---|---|---|",
        ]
        lines += [f"| {label} | {_cell(evaluation, key)} | {_cell(evaluation, twin)} | "
                  f"{_cell(evaluation, base)} |" for key, label, twin, base in ROWS]
        if (folder / "rollout.png").exists():
            lines += ["", "![model over game, free play](rollout.png)"]
    lines += [
        "",
        "## Limitations",
        "- Trained on one policy's play: states a person reaches that it never did (a later "
        "level, a high score) are guesses.",
        "- Where the game is random (a serve's moment and direction) the world draws one of "
        "the outcomes its prior learnt, then each pixel's most likely colour: outcomes the "
        "prior rarely saw are drawn rarely."
        if unet.get("code_grid") else
        "- The most likely colour per pixel: where the game is random (a serve's direction) "
        "the model picks one outcome and can drop a fast small object.",
    ]
    path = folder / "MODEL_CARD.md"
    path.write_text("\n".join(lines) + "\n")
    return path


#: what a setting was before ``GameTrainConfig`` had it (a record written then lacks it)
BEFORE_THE_FIELD = {"latent_dim": 0, "corrupt": 0.0, "code_grid": 0, "loss_cutoff": 0.0}
#: settings of the command line, not ``--set``, of the recording only, or that change no
#: weight (the learning curve's snapshots)
_NOT_SET = ("env", "out", "data", "device", "curve")


def chain(training: dict, folder: Path) -> list[str]:
    """The commands that rebuild the world of ``training`` (a ``training.json``), one a line:
    a ``worldstream record`` of its data where the run read a separate recording, then the
    ``worldstream train`` with every setting that differs from today's defaults as ``--set``
    (a setting the record lacks counts as what it was before the field existed; a retired
    one at today's value is dropped). ValueError for a setting today's recipe no longer has."""
    import dataclasses

    from worldstream.engine.models.game.unet import drop_retired
    from worldstream.engine.training.game.train import GameTrainConfig

    try:
        cfg = drop_retired(training["config"])
    except ValueError as err:
        raise ValueError(f"{folder}/training.json: {err}") from None
    unknown = set(cfg) - {f.name for f in dataclasses.fields(GameTrainConfig)}
    if unknown:
        raise ValueError(f"{folder}/training.json: settings the recipe no longer has: "
                         f"{sorted(unknown)}")
    name = Path(folder).resolve().name
    lines, data = [], ""
    if cfg.get("data"):
        data = f"data/{Path(cfg['data']).name}"
        lines.append(f"worldstream record --env {cfg['env']} --frames {training['frames']} "
                     f"--seed {cfg['seed']} --workers {cfg['workers']} --size {cfg['size']} "
                     f"--out {data}")
    sets = []
    for field in dataclasses.fields(GameTrainConfig):
        if field.name in _NOT_SET or (data and field.name in ("record_frames", "workers")):
            continue
        if field.name.startswith(("latent_", "kl_")) and field.name != "latent_dim" and not (
                cfg.get("latent_dim", BEFORE_THE_FIELD["latent_dim"]) or
                cfg.get("code_grid", BEFORE_THE_FIELD["code_grid"])):
            continue  # no latent: its settings mean nothing
        if field.name.startswith("code_") and field.name != "code_grid" and (
                not cfg.get("code_grid", BEFORE_THE_FIELD["code_grid"])):
            continue  # no code: likewise
        default = field.default_factory() if callable(field.default_factory) else field.default
        value = cfg.get(field.name, BEFORE_THE_FIELD.get(field.name, default))
        value = list(value) if isinstance(value, tuple) else value
        default = list(default) if isinstance(default, tuple) else default
        if value != default:
            sets.append(f"--set {field.name}={json.dumps(value, separators=(',', ':'))}")
    device = f" --device {cfg['device']}" if cfg.get("device", "cpu") != "cpu" else ""
    lines.append(f"worldstream train --env {cfg['env']}" + (f" --data {data}" if data else "")
                 + f" --out runs/{name}{device}" + "".join(f" {s}" for s in sets))
    return lines


def _machine(training: dict) -> str:
    cfg = training["config"]
    if cfg.get("device", "cpu") != "cpu":
        return cfg["device"]
    threads = cfg.get("threads", 0)
    cores = f"{threads} thread{'s' if threads != 1 else ''}" if threads else "torch's threads"
    return f"{training['cpu']} ({cores})" if training.get("cpu") else (
        f"a CPU the record does not name ({cores})")


def _shown(folder: Path) -> str:
    """``folder`` as a card shows it: relative to the working folder where inside it, else
    ``DIR`` (no machine's absolute path in a card)."""
    if not Path(folder).is_absolute():
        return str(folder)
    rel = os.path.relpath(folder)
    return "DIR" if rel.startswith("..") else rel


def _settings(env_id: str) -> str:
    """The settings the project gives ``env_id`` for determinism (``env.DETERMINISTIC``)."""
    from worldstream.engine.worlds.game.env import DETERMINISTIC

    kwargs = next((v for k, v in DETERMINISTIC.items() if env_id.startswith(k)), {})
    return ", ".join(f"`{k}={v}`" for k, v in kwargs.items()) or "as the env defines them"
