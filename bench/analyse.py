"""``python -m bench analyse session.json [--out DIR]``: plots and percentiles of a latency-lab
export.

Export format (written by the page's latency-session mode and by ``python -m bench e2e``):
a JSON list with one object per action the user pressed, or an object ``{"meta": {...},
"actions": [...]}`` whose ``meta`` (browser, hardware, model, settings; free-form) is copied
into the report. Each action object:

==================  =======================  ==================================================
key                 type                     meaning
==================  =======================  ==================================================
``action_seq``      int >= 0 (required)      the action's client sequence number
``t_action_ms``     number (required)        client clock when the key was pressed, ms
``t_photon_ms``     number or null           client clock when the first frame conditioned on
                    (required)               the action was presented (``requestVideoFrame
                                             Callback``), ms; null: never answered
``frame_index``     int (optional)           that frame's index in the stream
``keys``            list of str (optional)   the keys held from this action on
``stages_ms``       {str: number} (optional) that frame's server stage times (denoise,
                                             cache_fill, decode, queue, ...), ms
==================  =======================  ==================================================

Both times must come from one clock (e.g. ``performance.now()``). Action-to-photon latency is
``t_photon_ms - t_action_ms``; an action answered before it was pressed is an invalid export.
Outputs (``--out``, default ``results/analyse/``): ``result.json``, ``result.md``,
``histogram.png``, ``over_time.png`` and, when stage times are present, ``stages.png``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from worldstream.bench.stats import summarize


class ExportError(ValueError):
    """The export does not follow the documented format; the message names the entry."""


def load_export(data) -> tuple[dict, list[dict]]:
    """Validate a parsed export; returns ``(meta, actions)``. Raises :class:`ExportError`."""
    meta = {}
    if isinstance(data, dict):
        if not isinstance(data.get("actions"), list):
            raise ExportError("an export object needs an \"actions\" list")
        meta = data.get("meta") or {}
        data = data["actions"]
    if not isinstance(data, list):
        raise ExportError("an export is a JSON list of actions (or {\"actions\": [...]})")
    actions = []
    for i, a in enumerate(data):
        if not isinstance(a, dict):
            raise ExportError(f"entry {i}: expected an object, got {type(a).__name__}")
        for key in ("action_seq", "t_action_ms", "t_photon_ms"):
            if key not in a:
                raise ExportError(f"entry {i}: missing {key!r}")
        if not isinstance(a["action_seq"], int) or isinstance(a["action_seq"], bool) \
                or a["action_seq"] < 0:
            raise ExportError(f"entry {i}: action_seq must be an int >= 0")
        for key in ("t_action_ms", "t_photon_ms"):
            v = a[key]
            if v is None and key == "t_photon_ms":
                continue
            if not isinstance(v, int | float) or isinstance(v, bool) or not np.isfinite(v):
                raise ExportError(f"entry {i}: {key} must be a finite number")
        if a["t_photon_ms"] is not None and a["t_photon_ms"] < a["t_action_ms"]:
            raise ExportError(f"entry {i}: t_photon_ms is before t_action_ms")
        stages = a.get("stages_ms")
        if stages is not None and (not isinstance(stages, dict) or not all(
                isinstance(v, int | float) for v in stages.values())):
            raise ExportError(f"entry {i}: stages_ms must map stage names to numbers")
        actions.append(a)
    return meta, actions


def analyse(actions: list[dict]) -> dict:
    """Figures of validated actions: ``latency_ms`` (summarize), ``answered``,
    ``unanswered``, ``duration_s``, ``stages_ms`` (mean per stage over answered actions)."""
    answered = [a for a in actions if a["t_photon_ms"] is not None]
    lat = [a["t_photon_ms"] - a["t_action_ms"] for a in answered]
    t = [a["t_action_ms"] for a in actions]
    stages: dict[str, list[float]] = {}
    for a in answered:
        for k, v in (a.get("stages_ms") or {}).items():
            stages.setdefault(k, []).append(float(v))
    return {"latency_ms": summarize(lat), "answered": len(answered),
            "unanswered": len(actions) - len(answered),
            "duration_s": (max(t) - min(t)) / 1e3 if t else 0.0,
            "stages_ms": {k: float(np.mean(v)) for k, v in stages.items()}}


def _markdown(source: str, meta: dict, res: dict) -> str:
    from worldstream.bench.results import table

    lat = res["latency_ms"]
    rows = [["actions answered / unanswered", f"{res['answered']} / {res['unanswered']}"],
            ["session length (s)", res["duration_s"]]]
    rows += [[f"action-to-photon {k} (ms)", lat[k]] for k in ("p50", "p95", "p99", "mean",
                                                               "min", "max")]
    rows += [[f"stage {k} (ms, mean)", v] for k, v in res["stages_ms"].items()]
    meta_md = "".join(f"- {k}: {v}\n" for k, v in meta.items())
    return f"# Latency session `{source}`\n\n{meta_md}\n" + table(["figure", "value"], rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench analyse", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("export", help="latency-lab export (JSON)")
    parser.add_argument("--out", default=None, help="output folder (default results/analyse)")
    parser.add_argument("--json", default=None, help="also write the result JSON here")
    args = parser.parse_args(argv)

    from worldstream.bench import plots, results

    try:
        meta, actions = load_export(json.loads(Path(args.export).read_text()))
    except (OSError, json.JSONDecodeError, ExportError) as err:
        print(f"analyse: {args.export}: {err}", file=sys.stderr)
        return 2
    res = analyse(actions)
    answered = [a for a in actions if a["t_photon_ms"] is not None]
    lat = [a["t_photon_ms"] - a["t_action_ms"] for a in answered]
    t0 = min((a["t_action_ms"] for a in actions), default=0.0)
    figures = {
        "histogram": plots.latency_histogram(lat, f"action-to-photon ({len(lat)} actions)"),
        "over_time": plots.latency_over_time([(a["t_action_ms"] - t0) / 1e3 for a in answered],
                                             lat, "action-to-photon over the session")}
    if res["stages_ms"]:
        figures["stages"] = plots.stage_bars(res["stages_ms"], "server stages (mean ms)")
    payload = results.stamp_payload("analyse", {"source": str(args.export), "meta": meta,
                                                "analysis": res}, argv)
    root = Path(args.out).parent if args.out else None
    folder = results.save(Path(args.out).name if args.out else "analyse", payload,
                          _markdown(args.export, meta, res), figures, root=root)
    print(f"report: {folder / 'result.md'}", file=sys.stderr)
    results.print_json(payload, args.json)
    return 0
