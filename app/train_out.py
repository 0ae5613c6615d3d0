"""Where the training commands write: ``--out`` (or a default under the working folder), never
into the shipped ``assets/`` unless ``--out`` names it and ``--force`` is given; and the model
folder a built-in world's training leaves playable (``play --world W --model-path DIR``)."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from worldstream.engine.worlds.catalog import ASSETS


def add_force(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--force", action="store_true",
                        help="allow an --out inside the shipped assets/ (replaces what shipped)")


def check_out(out: Path, force: bool) -> Path:
    """``out``; ValueError when it lies inside the shipped ``assets/`` and ``force`` is off."""
    inside = Path(out).resolve().is_relative_to(ASSETS.resolve())
    if inside and not force:
        raise ValueError(f"--out {out} is inside the shipped assets/ ({ASSETS}); training would "
                         "replace what shipped: name another folder, or add --force")
    return Path(out)


def complete_model_folder(folder: Path, vae: Path, shipped: Path) -> None:
    """Make ``folder`` (holding a trained ``transformer/``) playable with ``play --model-path``:
    the autoencoder the model was trained on as ``vae/`` and the world's shipped stream
    settings, each copied when the folder has none. A ``vae/`` there that is not ``vae`` is
    kept, with a warning (the model plays with the autoencoder it learnt on)."""
    target = folder / "vae"
    if not target.exists():
        shutil.copytree(vae, target)
    elif target.resolve() != Path(vae).resolve():
        print(f"note: {target} is kept; this model learnt on {vae}'s latents")
    settings = shipped / "stream_config.json"
    if settings.is_file() and not (folder / settings.name).exists():
        shutil.copy2(settings, folder / settings.name)


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``; the platform's processor elsewhere)."""
    import platform

    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def portable_record(folder: Path) -> None:
    """Rewrite ``folder/training.json`` (``worldstream train``'s) so that it names no machine
    path: the config's ``out`` as ``"."`` (this folder) and ``data`` relative to it; and add
    the CPU it was trained on (``cpu``) where it names none."""
    import json
    import os

    path = Path(folder) / "training.json"
    record = json.loads(path.read_text())
    cfg = record["config"]
    if cfg.get("data"):
        cfg["data"] = os.path.relpath(Path(cfg["data"]).resolve(), Path(folder).resolve())
    cfg["out"] = "."
    if cfg.get("device", "cpu") == "cpu":
        record.setdefault("cpu", cpu_name())
    path.write_text(json.dumps(record, indent=1) + "\n")
