"""The world/model choice of ``play`` with game worlds: ``--env ID`` (any Gymnasium game, or
``module:factory``), the named game worlds of ``--world`` (``pong``, ``breakout``) and
``--keymap FILE`` (the page's keys for the game, instead of those derived from its action
meanings)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path


def world_choices() -> tuple[str, ...]:
    """``--world`` values: the built-in worlds and the named game worlds."""
    from worldstream.engine.core import registry

    return registry.WORLDS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--env", default=None, metavar="ID",
                        help="play a Gymnasium game as the world: an id with image "
                             "observations and discrete actions (ALE/Pong-v5, "
                             "ALE/Breakout-v5, ...) or module:factory (your own code, "
                             "imported: taken only from the command line, never from an "
                             "input log or save file); the model defaults to "
                             "sim, the game itself, or to builtin, its learned world, with "
                             "--model-path DIR (a folder of `worldstream train`)")
    parser.add_argument("--keymap", type=Path, default=None, metavar="FILE",
                        help="a game world's key map (JSON: \"keys\" browser code -> key "
                             "name, \"actions\" held keys -> action meaning) instead of the "
                             "one derived from its action meanings")


@dataclass(frozen=True)
class WorldChoice:
    """``world``: the world's name (a game given by ``--env``: its id); ``model``: the model
    family; ``backend``: the registry's backend id; ``env``: the game's env, None for the
    built-in worlds."""

    world: str
    model: str
    backend: str
    env: str | None


def resolve(args: argparse.Namespace, default_model: str = "builtin") -> WorldChoice:
    """The world and model of ``--world``/``--env``/``--model``/``--keymap`` (``--model``
    defaults to ``default_model``; with ``--env`` to ``builtin`` when ``--model-path`` is
    given, else ``sim``); ValueError (one line) for a pair that has no backend, ``--env`` with
    ``--world``, or ``--keymap`` without a game world."""
    from worldstream.engine.core.registry import (
        GAME_WORLDS,
        backend_id,
        env_backend_id,
        env_of,
    )

    if args.env is not None:
        if args.world is not None:
            raise ValueError("--env and --world exclude each other (--env plays any game)")
        # a model folder means its learned world; without one the game itself
        model = args.model or ("builtin" if getattr(args, "model_path", None) else "sim")
        backend = env_backend_id(args.env, model)
        choice = WorldChoice(args.env.strip(), model, backend, env_of(backend))
    else:
        world = args.world or "landscape"
        model = args.model or default_model
        backend = backend_id(world, model)
        choice = WorldChoice(world, model, backend, GAME_WORLDS.get(world))
    if getattr(args, "keymap", None) is not None:
        if choice.env is None:
            raise ValueError("--keymap goes with a game world (--env ID, --world "
                             f"{'|'.join(GAME_WORLDS)})")
        if not Path(args.keymap).is_file():
            raise FileNotFoundError(f"key map not found: {args.keymap}")
    return choice


def backend_kwargs(args: argparse.Namespace, choice: WorldChoice) -> dict:
    """``load_backend`` arguments of a game world (its key map file), none for others."""
    keymap = getattr(args, "keymap", None)
    return {"keymap": str(keymap)} if choice.env is not None and keymap is not None else {}
