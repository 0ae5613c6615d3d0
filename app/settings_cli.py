"""The one way the commands take settings: ``--set field=value`` (repeatable; fields of a
config dataclass, validated; ``--set help`` lists them with their values and one line of doc
each)."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--set", dest="sets", action="append", default=[],
                        metavar="FIELD=VALUE",
                        help="override a setting (repeatable; values as JSON: 2, 0.5, true, "
                             "null, [32, 80]); `--set help` lists the settings")


def wants_help(args: argparse.Namespace) -> bool:
    """Whether ``--set help`` was given."""
    return "help" in args.sets


def overrides(cls: type, args: argparse.Namespace) -> dict:
    """``--set`` items as ``cls`` field values; ValueError naming a bad one."""
    from worldstream.engine.backends.settings import parse_overrides

    # ``help`` is a request, not a setting: the other items still show in the listing
    return parse_overrides(cls, [item for item in args.sets if item != "help"])


def print_settings(cls: type, values: dict, source: str) -> int:
    """Print ``cls``'s settings with ``values`` (from ``source``) over the defaults."""
    from worldstream.engine.backends.settings import describe

    print(f"settings (values: {source}, else the defaults); change one with --set FIELD=VALUE"
          "\n")
    print(describe(cls, values))
    return 0


def builtin_overrides(args: argparse.Namespace) -> dict:
    """``--set`` items as built-in model settings (``BuiltinConfig``)."""
    from worldstream.engine.backends.builtin import BuiltinConfig

    return overrides(BuiltinConfig, args)


def print_builtin_settings(world: str, model_path: str | Path | None = None,
                           command_values: dict | None = None) -> int:
    """``--set help`` of the built-in model family, with ``world``'s values and those the
    command sets itself (``command_values``: ``play`` compiles the model)."""
    from worldstream.engine.backends.builtin import BuiltinConfig
    from worldstream.engine.backends.settings import SETTINGS_FILE, load_settings
    from worldstream.engine.worlds.catalog import world as world_spec

    folder = Path(model_path) if model_path else world_spec(world).assets
    values = {**load_settings(BuiltinConfig, folder), **(command_values or {})}
    anchored = values.get("colour_anchor", BuiltinConfig.colour_anchor) is not None
    if "colour_prior" not in values and anchored:  # loaded from a file, not a setting
        from worldstream.engine.models.builtin.colour_prior import FILENAME
        from worldstream.engine.models.builtin.loading import BUILTIN_DIR

        path = folder / FILENAME if (folder / FILENAME).is_file() else BUILTIN_DIR / FILENAME
        values["colour_prior"] = _Shown(f"loaded from {_relative(path)}")
    source = str(folder / SETTINGS_FILE) + (", this command" if command_values else "")
    return print_settings(BuiltinConfig, values, source)


class _Shown:
    """A value shown as it reads (not quoted) in a ``--set help`` listing."""

    def __init__(self, text: str):
        self.text = text

    def __str__(self) -> str:
        return self.text


def _relative(path: Path) -> str:
    """``path`` relative to the working folder where it lies under it."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)
