"""``worldstream`` command line. Each sub-command lives in its own ``app.cmd_*`` module that
exposes ``register(subparsers)``; the parser sets ``func(args) -> int`` (the exit code)."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from worldstream.engine.core.registry import BackendUnavailableError

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

# module names of the sub-commands, in --help order
COMMANDS = ("play", "generate", "record", "train", "train_ae", "train_world", "fit_colour_prior",
            "eval")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="worldstream",
        description="worldstream: a steerable, real-time video / world-model playground. "
        "`worldstream play` opens the playground on the built-in model; `worldstream "
        "COMMAND --help` describes each command.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"worldstream.app.cmd_{name}")
        except ModuleNotFoundError as err:
            if err.name != f"worldstream.app.cmd_{name}":
                raise
            continue
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ValueError, OSError, RecursionError, BackendUnavailableError) as err:
        # bad input (a file, a value: engine.core.reader), a file that cannot be read or a
        # model that cannot load here: one line, exit code 2
        print(f"worldstream {args.command}: error: {_one_line(err)}", file=sys.stderr)
        return 2
    except Exception as err:
        # NOTE: no traceback reaches a user; one who debugs asks for it
        if os.environ.get("WORLDSTREAM_TRACEBACK"):
            raise
        print(f"worldstream {args.command}: internal error: {type(err).__name__}: "
              f"{_one_line(err)} (WORLDSTREAM_TRACEBACK=1 shows where)", file=sys.stderr)
        return 1


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return text if len(text) <= 500 else text[:497] + "..."


if __name__ == "__main__":
    sys.exit(main())
