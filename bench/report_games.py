"""The game worlds' section of ``bench/RESULTS.md``: each game's ``worldstream eval`` figures
beside the goals of the game-world issue (issue 54) and the env's ground-truth twin.

Sources: the shipped worlds' ``assets/<world>/eval.json`` and ``training.json`` (written by
``worldstream eval --card`` and ``worldstream train``), and ``bench/games/<name>.json`` for games
measured but not shipped: ``{"eval": <eval --json output>, "training": <training.json>,
"command": ..., "date": ..., "cpu": ...}``.
"""

from __future__ import annotations

import json
from pathlib import Path

from worldstream.bench.results import fmt, table

BENCH_DIR = Path(__file__).resolve().parent
ASSETS = BENCH_DIR.parent / "assets"
MEASURED = BENCH_DIR / "games"


def _within(lo: float | None, hi: float | None):
    return lambda v, e: (lo is None or v >= lo) and (hi is None or v <= hi)


#: (label, eval key, the bracket's key(s): the copy-last baseline and/or the ground-truth twin,
#: goal text, predicate(value, eval))
GOALS = [
    ("changed-pixel PSNR, teacher-forced (dB)", "changed_psnr_db", "copylast_changed_psnr_db",
     ">= 30", _within(30, None)),
    ("free-rollout PSNR at 16 frames (dB)", "rollout_psnr_db_16", "copylast_psnr_db_16",
     ">= copy-last + 2", lambda v, e: v >= e["copylast_psnr_db_16"] + 2),
    ("free-rollout PSNR at 64 frames (dB)", "rollout_psnr_db_64", "copylast_psnr_db_64",
     ">= copy-last", lambda v, e: v >= e["copylast_psnr_db_64"]),
    ("action effect, 1 frame after (corr)", "action_effect_corr", "gt_action_effect_corr",
     ">= 0.9", _within(0.9, None)),
    ("action effect, 4 frames after (corr)", "action_effect_corr_4", "gt_action_effect_corr_4",
     ">= 0.7", _within(0.7, None)),
    ("off-palette share, worst 100 frames", "off_palette_share", "gt_off_palette_share",
     "<= 0.02", _within(None, 0.02)),
    ("free-play change rate vs the env's (x)", "change_rate_ratio", "gt_change_rate_ratio",
     "0.5-2", _within(0.5, 2.0)),
    # the object table (issue 67): the game's moving objects, engine.evaluation.game.objects
    ("object recall at 4 frames", "object_recall_4",
     ("copylast_object_recall_4", "gt_object_recall_4"), ">= 0.8", _within(0.8, None)),
    ("object precision at 4 frames", "object_precision_4",
     ("copylast_object_precision_4", "gt_object_precision_4"), ">= 0.6", _within(0.6, None)),
    ("free-play moving objects per frame vs the env's (x)", "objects_ratio", "gt_objects_ratio",
     "0.67-1.5", _within(0.67, 1.5)),
    ("free-play births per 100 frames vs the env's (x)", "births_ratio", "gt_births_ratio",
     "0.67-1.5", _within(0.67, 1.5)),
]


def load_games(assets: Path = ASSETS, measured: Path = MEASURED) -> dict[str, dict]:
    """name -> ``{"eval", "training", "source"}`` for every game with an evaluation: shipped
    worlds (folders of ``assets`` with ``world.json`` and ``eval.json``) then ``measured``'s
    files, by name."""
    games: dict[str, dict] = {}
    for folder in sorted(assets.glob("*/")):
        if (folder / "world.json").is_file() and (folder / "eval.json").is_file():
            training = folder / "training.json"
            games[folder.name] = {
                "eval": json.loads((folder / "eval.json").read_text()),
                "training": json.loads(training.read_text()) if training.is_file() else {},
                "source": f"assets/{folder.name} (shipped)"}
    for path in sorted(measured.glob("*.json")) if measured.is_dir() else []:
        data = json.loads(path.read_text())
        games[path.stem] = {"eval": data["eval"], "training": data.get("training", {}),
                            "source": f"bench/games/{path.name} ({data.get('date', '?')[:10]}, "
                                      f"{data.get('cpu', '?')})"}
    return games


def _cell(ev: dict, key: str, twin: str | tuple[str, ...], ok) -> str:
    value = ev.get(key)
    if value is None:
        return "—"
    mark = "" if ok(value, ev) else " **miss**"
    digits = 1 if "psnr" in key else 3
    twins = (twin,) if isinstance(twin, str) else twin
    bracket = " / ".join(fmt(ev.get(t), 1 if len(twins) == 1 else 2) for t in twins)
    return f"{fmt(float(value), digits)} ({bracket}){mark}"


def _train_cell(training: dict) -> str:
    seconds = training.get("train_seconds")
    if seconds is None:
        return "—"
    cfg = training.get("config", {})
    return (f"{seconds / 60:.0f} min ({cfg.get('steps')} steps x {cfg.get('batch')}, "
            f"{cfg.get('threads')} thread(s))")


def render_games(games: dict[str, dict]) -> str:
    """The Markdown section: one column per game, one row per goal; each cell is the model's
    value with, in brackets, the copy-last-frame baseline (PSNR rows), the ground-truth twin
    (the env against itself), or both (object rows: copy-last / twin)."""
    if not games:
        return ""
    names = list(games)
    rows = [[label, goal, *(_cell(games[n]["eval"], key, twin, ok) for n in names)]
            for label, key, twin, goal, ok in GOALS]
    rows.insert(0, ["training wall time", "<= 60 min (default)",
                    *(_train_cell(games[n]["training"]) for n in names)])
    envs = ", ".join(f"{n}: `{games[n]['eval'].get('env')}`, {games[n]['source']}"
                     for n in names)
    return "\n".join([
        "## Game worlds (`worldstream eval`)", "",
        "Held-out episodes, streaming defaults. In brackets: the copy-last-frame baseline "
        "(PSNR rows), the env against itself (its ground-truth twin, which shows the metric "
        "is sound: 99 dB, 1.0, 0), or both (object rows: copy-last / twin). A moving object is "
        "a connected set of changed pixels of one palette colour; recall / precision: the "
        "share matched one to one to the other's objects of its colour within 2 px (cards "
        "of 2026-12-08 on; before, found within 2 px in the other's frame); a birth: an "
        "object where nothing moved the frame before. Goals from the game-world issues. "
        + envs + ".", "",
        table(["measure", "goal", *names], rows)])
