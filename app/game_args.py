"""The world/model choice of ``play`` with game worlds: ``--env ID`` (any Gymnasium game, or
``module:factory``), the named game worlds of ``--world`` (``pong``, ``breakout``) and
``--keymap FILE`` (the page's keys for the game, instead of those derived from its action
meanings)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from worldstream.engine.core.family import Family


def world_choices() -> tuple[str, ...]:
    """``--world`` values: the worlds of every family's row and the named game worlds."""
    from worldstream.engine.core import registry

    return registry.WORLDS


def model_choices() -> tuple[str, ...]:
    """``--model`` values: the models of the worlds, then the worlds of their own."""
    from worldstream.engine.core import registry

    return (*registry.WORLD_MODEL_NAMES, *registry.OWN_WORLD_MODELS)


def model_help() -> str:
    """``--model``'s help: each model with its rows' summaries (from the registry)."""
    from worldstream.engine.core import registry

    lines: dict[str, list[str]] = {}
    for family in registry.FAMILIES.values():
        if family.model and family.summary and family.summary not in lines.get(
                family.model, []):
            lines.setdefault(family.model, []).append(family.summary)
    return "model family: " + "; ".join(f"{m} ({' / '.join(s)})" for m, s in lines.items())


def models_with(fact: str) -> str:
    """The ``--model`` names whose rows declare ``fact`` (``variants``, ``frame_sizes``), as
    ``a or b`` for a one-line error."""
    from dataclasses import asdict

    from worldstream.engine.core import registry

    return " or ".join(dict.fromkeys(f.model for f in registry.FAMILIES.values()
                                     if asdict(f)[fact])) or "none"


def variant_choices() -> tuple[str, ...]:
    """``--variant`` values: every keyed-by-variant family's variants."""
    from worldstream.engine.core import registry

    return tuple(dict.fromkeys(v for f in registry.FAMILIES.values() for v in f.variants))


def frame_size_choices() -> tuple[str, ...]:
    """``--frame-size`` values: every family's ``frame_sizes``."""
    from worldstream.engine.core import registry

    return tuple(dict.fromkeys(s for f in registry.FAMILIES.values() for s in f.frame_sizes))


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


#: the world played when neither ``--world`` nor ``--env`` nor an own world's model is given
DEFAULT_WORLD = "landscape"


@dataclass(frozen=True)
class WorldChoice:
    """``world``: the world's name (a game given by ``--env``: its id; an own world: its
    model's name); ``model``: the model family (``--model``); ``backend``: the registry's
    backend id; ``env``: the game's env, None for the other worlds."""

    world: str
    model: str
    backend: str
    env: str | None

    @property
    def family(self) -> Family:
        """The backend's family row (its declared facts)."""
        from worldstream.engine.core.registry import family_of

        found = family_of(self.backend)
        if found is None:  # resolve() made it from a row: only a registry changed since
            raise ValueError(f"no model family for {self.backend!r}")
        return found


def resolve(args: argparse.Namespace) -> WorldChoice:
    """The world and model of ``--world``/``--env``/``--model``/``--keymap``. ``--model`` of a
    world of its own (``registry.OWN_WORLD_MODELS``) takes no ``--world`` or ``--env``;
    without ``--model`` a world plays its ``default`` family's model, and a game given by
    ``--env`` its default one with ``--model-path``, else its simulator. ValueError (one line)
    for a pair that has no backend, ``--env`` with ``--world``, or ``--keymap`` without a game
    world."""
    from worldstream.engine.core.registry import (
        GAME_WORLDS,
        OWN_WORLD_MODELS,
        backend_id,
        default_model,
        env_backend_id,
        env_default_model,
        env_of,
        model_family,
    )

    if args.model is not None and args.model in OWN_WORLD_MODELS:
        if args.world is not None or args.env is not None:
            raise ValueError(f"--model {args.model} is its own world: no --world or --env")
        family = model_family(args.model)
        assert family is not None  # OWN_WORLD_MODELS is derived from the rows
        choice = WorldChoice(args.model, args.model, family.name, None)
    elif args.env is not None:
        if args.world is not None:
            raise ValueError("--env and --world exclude each other (--env plays any game)")
        # a model folder means its learned world; without one the game itself
        model = args.model or env_default_model(bool(getattr(args, "model_path", None)))
        backend = env_backend_id(args.env, model)
        choice = WorldChoice(args.env.strip(), model, backend, env_of(backend))
    else:
        world = args.world or DEFAULT_WORLD
        model = args.model or default_model(world)
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
