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


def family_overrides(family, args: argparse.Namespace) -> dict:
    """``--set`` items as settings of ``family`` (an ``engine.core.family.Family``: its
    ``settings`` class); ValueError for items given to a family that takes none."""
    items = [item for item in args.sets if item != "help"]
    if family.settings is None:
        if items:
            raise ValueError(_none(family))
        return {}
    return overrides(_named(family.settings), args)


def print_family_settings(family, world: str, model_path: str | Path | None = None,
                          command_values: dict | None = None) -> int:
    """``--set help`` of ``family``: its settings with the values its ``settings_source`` reads
    for ``world`` (none: the defaults) and those the command sets itself
    (``command_values``: ``play`` compiles the model); ValueError for a family that takes no
    settings."""
    if family.settings is None:
        raise ValueError(_none(family))
    values, source = (_named(family.settings_source)(world, model_path)
                      if family.settings_source is not None else ({}, "the defaults"))
    if command_values:
        values, source = {**values, **command_values}, source + ", this command"
    return print_settings(_named(family.settings), values, source)


def _none(family) -> str:
    """The one line for ``--set`` given to ``family``, which takes none: the models that do."""
    from worldstream.engine.core.registry import FAMILIES

    takers = " or ".join(dict.fromkeys(f.model for f in FAMILIES.values() if f.settings))
    return (f"--set takes the {takers or 'no'} model's settings; --model "
            f"{family.model or family.name} has none")


def _named(target: str):
    """The object ``module:name`` names (a family row's settings class or help)."""
    import importlib

    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)
