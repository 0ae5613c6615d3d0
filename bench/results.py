"""Where benchmark results go and how they read: ``results/<suite>/`` holds ``result.json`` (the
latest run), ``result.md`` (its Markdown report), PNG plots, and ``history/<UTC stamp>.json``
(every run). Every report opens with the date, the command, the hardware and software stack,
the model and the settings, so a number never travels without what it was measured on.
"""

from __future__ import annotations

import datetime as dt
import json
import shlex
import sys
from pathlib import Path

RESULTS_DIR = Path(__file__).resolve().parents[1] / "results"


def stamp_payload(suite: str, payload: dict, argv: list[str] | None) -> dict:
    """``payload`` with ``suite``, ``date`` (UTC ISO 8601) and ``command`` added in front."""
    command = "python -m bench " + " ".join(shlex.quote(a) for a in [suite, *(argv or [])])
    return {"suite": suite, "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "command": command, **payload}


def save(suite: str, payload: dict, markdown: str, figures: dict | None = None,
         root: Path | None = None) -> Path:
    """Write the run's JSON, Markdown and ``figures`` (name -> matplotlib Figure, saved as
    ``<name>.png``) under ``root/<suite>/`` (default :data:`RESULTS_DIR`); return the folder.
    The figures are closed after saving."""
    import matplotlib.pyplot as plt

    folder = (root or RESULTS_DIR) / suite
    (folder / "history").mkdir(parents=True, exist_ok=True)
    text = json.dumps(payload, indent=2, default=float)
    (folder / "result.json").write_text(text + "\n")
    stamp = payload.get("date", "undated").replace(":", "")
    (folder / "history" / f"{stamp}.json").write_text(text + "\n")
    (folder / "result.md").write_text(markdown)
    for name, fig in (figures or {}).items():
        fig.savefig(folder / f"{name}.png", dpi=110, bbox_inches="tight")
        plt.close(fig)
    return folder


def load_latest(suite: str, root: Path | None = None) -> dict | None:
    """The latest ``result.json`` of ``suite``, or None when it never ran."""
    path = (root or RESULTS_DIR) / suite / "result.json"
    return json.loads(path.read_text()) if path.is_file() else None


def load_runs(suite: str, root: Path | None = None) -> list[dict]:
    """Every saved run of ``suite``, oldest first: ``history/*.json``, or the latest
    ``result.json`` alone when no history was kept; [] when the suite never ran."""
    folder = (root or RESULTS_DIR) / suite
    paths = sorted((folder / "history").glob("*.json")) if (folder / "history").is_dir() else []
    if not paths and (folder / "result.json").is_file():
        paths = [folder / "result.json"]
    return [json.loads(p.read_text()) for p in paths]


def history_row(payload: dict) -> dict | None:
    """One row of the benchmark history (the keys of ``bench/history.json``) from a saved
    ``quick`` or ``e2e`` run; None for other suites or a run without its figures."""
    hw, settings = payload.get("hardware", {}), payload.get("settings", {})
    row = {"date": payload.get("date", "?"), "cpu": hw.get("gpu") or hw.get("cpu_model", "?"),
           "command": payload.get("command", "?"), "world": settings.get("world", "landscape"),
           "model": settings.get("backend") or settings.get("model") or "builtin",
           "steps": settings.get("steps"),
           "note": f"saved run, load avg {fmt(hw.get('load_avg_1m'), 1)}"}
    if payload.get("suite") == "quick" and payload.get("fps") is not None:
        return {**row, "fps": payload["fps"], "p50_ms": payload.get("action_to_frame_ms_p50"),
                "p95_ms": payload.get("action_to_frame_ms_p95"), "latency": "action-to-frame"}
    if payload.get("suite") == "e2e" and "e2e" in payload:
        lat = payload["e2e"]["action_to_photon_ms"]
        return {**row, "fps": payload["e2e"]["fps"], "p50_ms": lat.get("p50"),
                "p95_ms": lat.get("p95"), "latency": "action-to-photon"}
    return None


def fmt(value, digits: int = 1) -> str:
    """A table cell: numbers rounded, None as an em dash, booleans as yes/no."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def table(headers: list[str], rows: list[list], digits: int = 1) -> str:
    """A GitHub Markdown table."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(fmt(c, digits) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def context_md(payload: dict) -> str:
    """The "measured on" block of a report: date, command, hardware, versions, model,
    settings (whatever of these the payload carries)."""
    hw = payload.get("hardware", {})
    model = payload.get("model", {})
    lines = [f"- date: {payload.get('date', '?')}",
             f"- command: `{payload.get('command', '?')}`"]
    if hw:
        gpu = hw.get("gpu") or "none"
        lines.append(f"- hardware: {hw.get('cpu_model')} ({hw.get('cpu_cores')} logical cores, "
                     f"{hw.get('torch_threads')} torch threads, load avg "
                     f"{fmt(hw.get('load_avg_1m'), 2)}; features "
                     f"{', '.join(hw.get('cpu_features', [])) or 'none'}); GPU: {gpu}")
        lines.append(f"- software: torch {hw.get('torch')}, triton {hw.get('triton')}, "
                     f"python {hw.get('python')}, {hw.get('platform')}")
    if model:
        lines.append(f"- model: {model.get('name')} ({model.get('params_m')} M params, dim "
                     f"{model.get('dim')}, depth {model.get('depth')}, {model.get('heads')} "
                     f"heads; weights: **{model.get('weights')}**), resolution "
                     f"{model.get('resolution')}")
    if payload.get("settings"):
        settings = ", ".join(f"{k}={v}" for k, v in payload["settings"].items())
        lines.append(f"- settings: {settings}")
    if payload.get("notes"):
        lines.extend(f"- note: {n}" for n in payload["notes"])
    return "\n".join(lines) + "\n"


def print_json(payload: dict, path: str | None) -> None:
    """Print ``payload`` as one JSON object on stdout; also write it to ``path`` if given."""
    text = json.dumps(payload, default=float)
    if path:
        Path(path).write_text(json.dumps(payload, indent=2, default=float) + "\n")
    sys.stdout.write(text + "\n")
