"""Model backends by name (``--model NAME``): the families' rows, read from installed metadata
at every start, and backends made from them lazily (``sim`` never loads torch).

Every family, the shipped ones included, arrives through the ``worldstream.families`` entry
point group (``importlib.metadata``): an entry point names a :class:`Family`, a sequence of
them, or a callable returning one. Nothing is kept between starts, so a family installed or
removed with pip is there, or gone, at the next start of any process (a command, a Ray
replica). A plugin that fails to load is one line on stderr naming its distribution and entry
point, and the other families still load. This module names no family.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import sys
from collections.abc import Iterable
from typing import Any

from worldstream.engine.core.backend import WorldBackend
from worldstream.engine.core.family import Family

__all__ = ["Family", "FAMILIES", "register", "discover", "load_backend", "family_of"]

#: the entry point group a family's distribution declares
ENTRY_POINT_GROUP = "worldstream.families"

FAMILIES: dict[str, Family] = {}
#: one line per entry point that failed at the last :func:`discover`
PLUGIN_ERRORS: list[str] = []
#: named game worlds (``--world NAME``) -> their env: the named worlds of families keyed by env
GAME_WORLDS: dict[str, str] = {}
#: the families whose key is a game's env
_ENV_FAMILIES: frozenset[str] = frozenset()
#: model family (``--model``) -> backend family of a game world (``--env ID``)
ENV_MODELS: dict[str, str] = {}
#: (world, model family) -> backend id: the two axes of ``--world`` and ``--model``
WORLD_MODELS: dict[tuple[str, str], str] = {}
#: ``--world`` values, and the ``--model`` values of a world (``--world``, ``--env``)
WORLDS: tuple[str, ...] = ()
WORLD_MODEL_NAMES: tuple[str, ...] = ()
#: ``--model`` values that are a world of their own (no ``--world``)
OWN_WORLD_MODELS: tuple[str, ...] = ()


def _derive() -> None:
    """The tables above, from :data:`FAMILIES` (each family's row is the one place it is
    written)."""
    global _ENV_FAMILIES, WORLDS, WORLD_MODEL_NAMES, OWN_WORLD_MODELS
    rows = FAMILIES.values()
    _ENV_FAMILIES = frozenset(f.name for f in rows if f.keyed == "env")
    GAME_WORLDS.clear()
    GAME_WORLDS.update({w: k for f in rows if f.keyed == "env" for w, k in f.world_keys})
    ENV_MODELS.clear()
    ENV_MODELS.update({f.model: f.name for f in rows if f.keyed == "env"})
    WORLD_MODELS.clear()
    for f in rows:
        for world in f.worlds:
            WORLD_MODELS[(world, f.model)] = f.backend_id(world)
    WORLDS = tuple(dict.fromkeys(w for w, _ in WORLD_MODELS))
    WORLD_MODEL_NAMES = tuple(dict.fromkeys(m for _, m in WORLD_MODELS))
    OWN_WORLD_MODELS = tuple(f.model for f in rows if f.own_world)


def register(family: Family) -> None:
    """Add a model family (its one row) to those ``--model``, ``load_backend``, input logs and
    save points know; TypeError for a row that is not a :class:`Family`, ValueError for a name
    or a (world, model) pair already taken, or a ``--model`` name that would mean both a world
    of its own and a model of a world."""
    if not isinstance(family, Family):
        raise TypeError(f"expected a Family row, got {type(family).__name__}")
    taken = [str(pair) for pair in sorted({(w, family.model) for w in family.worlds}
                                          & set(WORLD_MODELS))]
    if family.name in FAMILIES:
        taken.append(family.name)
    clash = (OWN_WORLD_MODELS + WORLD_MODEL_NAMES) if family.own_world else OWN_WORLD_MODELS
    if family.model and family.model in clash:
        taken.append(f"--model {family.model}")
    if taken:
        raise ValueError(f"model family {family.name!r}: already registered "
                         f"({', '.join(taken)})")
    FAMILIES[family.name] = family
    _derive()


def _rows(obj: Any) -> list[Family]:
    """An entry point's object as rows: a Family, a sequence of them, or a callable returning
    either; TypeError for anything else."""
    if callable(obj) and not isinstance(obj, Family):
        obj = obj()
    rows = [obj] if isinstance(obj, Family) else list(obj) if isinstance(obj, Iterable) \
        else None
    if rows is None or not all(isinstance(r, Family) for r in rows):
        raise TypeError("expected a Family, a sequence of Family rows or a callable "
                        f"returning one, got {type(obj).__name__}")
    return rows


def _entry_points() -> list[importlib.metadata.EntryPoint]:
    """The group's entry points, worldstream's own first (the shipped families' order is
    the order of ``--world`` and ``--model`` choices), then by distribution and name.

    NOTE: every copy of a distribution's metadata on ``sys.path`` is read, not only the first
    (as ``entry_points()`` does): an editable install leaves a ``worldstream.egg-info`` in the
    checkout, which shadows the installed metadata wherever the checkout is on ``sys.path``
    (pytest, ``python -m``) and may predate the entry point. :func:`discover` keeps the first
    of each (distribution, name)."""
    found = [ep for dist in importlib.metadata.distributions()
             for ep in dist.entry_points.select(group=ENTRY_POINT_GROUP)]

    def order(ep: importlib.metadata.EntryPoint) -> tuple[bool, str, str]:
        dist = _dist_name(ep)
        return dist != "worldstream", dist, ep.name

    return sorted(found, key=order)


def _dist_name(ep: importlib.metadata.EntryPoint) -> str:
    dist = ep.dist
    return "?" if dist is None else str(dist.metadata["Name"])


def discover() -> list[str]:
    """Read the families of every installed distribution's ``worldstream.families`` entry
    points afresh (the rows registered before are dropped); returns and prints (stderr) one
    line per entry point that failed, its rows left out."""
    FAMILIES.clear()
    PLUGIN_ERRORS.clear()
    _derive()
    seen: set[tuple[str, str]] = set()
    for ep in _entry_points():
        dist = _dist_name(ep)
        if (dist, ep.name) in seen:  # one distribution found twice on sys.path
            continue
        seen.add((dist, ep.name))
        try:
            rows = _rows(ep.load())
            for row in rows:  # all or none: check every row before taking any
                if row.name in FAMILIES:
                    raise ValueError(f"model family {row.name!r}: already registered")
            for row in rows:
                register(row)
        except Exception as err:  # a plugin's failure is its own: the others still load
            text = str(err).splitlines()[0] if str(err) else ""
            line = (f"worldstream: family plugin {ep.name!r} ({ep.value}) of distribution "
                    f"{dist!r} not loaded: {type(err).__name__}: {text}")
            PLUGIN_ERRORS.append(line)
            print(line, file=sys.stderr, flush=True)
    return list(PLUGIN_ERRORS)


def family_of(name: str) -> Family | None:
    """The family of a backend id (``NAME`` or ``NAME:KEY``), None for an unknown one."""
    return FAMILIES.get(str(name).partition(":")[0])


def model_family(model: str, world: str | None = None) -> Family | None:
    """The family that ``--model model`` names for ``world`` (None: an own world), None for
    none."""
    for f in FAMILIES.values():
        if f.model == model and (world in f.worlds if world is not None else f.own_world):
            return f
    return None


def default_model(world: str) -> str:
    """The ``--model`` a world plays when none is given: its ``default`` family's (else its
    first); ValueError for an unknown world."""
    rows = [f for f in FAMILIES.values() if world in f.worlds]
    if not rows:
        raise ValueError(f"no world {world!r}; there are: {', '.join(WORLDS)}")
    return next((f.model for f in rows if f.default), rows[0].model)


def simulator_model(world: str) -> str | None:
    """The ``--model`` of the ground-truth simulator of ``world``, None where it has none."""
    return next((f.model for f in FAMILIES.values() if f.simulator and world in f.worlds),
                None)


def env_default_model(with_weights: bool) -> str:
    """The ``--model`` of a game given by ``--env`` when none is given: the ``default`` family
    with a model folder (``with_weights``), else the simulator; ValueError where none is."""
    found = next((f.model for f in FAMILIES.values()
                  if f.keyed == "env" and (f.default if with_weights else f.simulator)), None)
    if found is None:
        raise ValueError(f"no {'default' if with_weights else 'simulator'} model for a game "
                         "world (--env)")
    return found


def env_backend_id(env: str, model: str | None = None) -> str:
    """The backend that plays the game ``env`` (``--env``) with model family ``model`` (None:
    the game's simulator); ValueError for an empty env or a family no game world has."""
    if not isinstance(env, str) or not env.strip():
        raise ValueError("--env needs a Gymnasium id (ALE/Pong-v5) or module:factory")
    model = env_default_model(False) if model is None else model
    family = ENV_MODELS.get(model)
    if family is None:
        raise ValueError(f"no model {model!r} for a game world (--env); there are: "
                         f"{sorted(ENV_MODELS)}")
    return f"{family}:{env.strip()}"


def takes_own_keys(name: str) -> bool:
    """Whether the backend ``name`` (as an input log records it) declares key names of its own
    instead of the direction keys (its family's ``own_keys``; False for an unknown name)."""
    family = family_of(name)
    return family is not None and family.own_keys


def env_of(name: str) -> str | None:
    """The env of a game world's backend id (``FAMILY:ALE/Pong-v5`` -> ``ALE/Pong-v5``),
    None for another backend."""
    family, _, env = name.partition(":")
    return env if family in _ENV_FAMILIES and env else None


def is_factory_env(env: str) -> bool:
    """Whether a game's env id names a module to import: ``module:factory`` (or Gymnasium's
    own ``module:Env-v0``), not a registered id (``ALE/Pong-v5``, from installed packages)."""
    return ":" in env


def model_of_file(model: object, named: str | None, name: str) -> str:
    """The model to load for a file (an input log, a save point) naming ``model``, checked as a
    string against ``named``, the backend the command line started (None: nothing named).
    Files travel between people: a game given as ``module:factory`` imports and calls code,
    so a file may name one only when the command line named the same (``--env
    MODULE:FACTORY``). ValueError (one line, naming ``name``) otherwise; nothing is imported."""
    if not isinstance(model, str) or not model.strip() or len(model) > 300 or \
            not model.isprintable():
        raise ValueError(f"{name}: model: expected a model id, got {str(model)[:80]!r}")
    if named is not None and model != named:
        raise ValueError(f"{name} was made with model {model!r}, not {named!r}")
    env = env_of(model)
    if named is None and env is not None and is_factory_env(env):
        raise ValueError(f"{name} names the game {env!r}, a module:factory: a file never "
                         f"imports code; name it yourself with --env {env}")
    return model


def backend_id(world: str, model: str) -> str:
    """The backend that plays ``world`` with model family ``model``; ValueError listing the
    pairs there are."""
    found = WORLD_MODELS.get((world, model))
    if found is None:
        pairs = ", ".join(f"--world {w} --model {m}" for w, m in WORLD_MODELS)
        raise ValueError(f"no model {model!r} for world {world!r}; there are: {pairs}")
    return found


class BackendUnavailableError(RuntimeError):
    """A known model cannot be loaded here (its module or weights are missing)."""


def _module_exists(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def load_backend(name: str, model_path: str | None = None, checkpoint: str | None = None,
                 **kwargs) -> WorldBackend:
    """The backend ``name`` built with ``kwargs`` (the backend's config fields), its weights
    from ``model_path`` (a folder) and ``checkpoint`` (a file) where the model takes them.
    ``name`` may be the id an input log records: ``FAMILY:KEY`` passes the key as the
    family's ``keyed`` argument (``env=ENV``, ``variant=VARIANT``).

    Raises ValueError for an unknown name (listing the known ones) or a path the model does
    not take, BackendUnavailableError naming the missing module or weights file when a known
    backend cannot be loaded.
    """
    family_name, _, key = str(name).partition(":")
    family = FAMILIES.get(family_name if key else name) if isinstance(name, str) else None
    if family is None or (key and family.keyed is None) or \
            (not key and family.keyed is not None and not family.key_optional):
        known = [f.name + (f":{f.keyed.upper()}" if f.keyed else "") for f in FAMILIES.values()]
        raise ValueError(f"unknown model {name!r}; known models: {', '.join(known)}")
    if key and family.keyed is not None:  # FAMILY:KEY
        if kwargs.get(family.keyed, key) != key:
            raise ValueError(f"model {name!r} is {family.keyed} {key!r}, not "
                             f"{kwargs[family.keyed]!r}")
        kwargs[family.keyed] = key
    if model_path is not None:
        if family.path_argument is None:
            raise ValueError(f"model {name!r} takes no --model-path")
        kwargs[family.path_argument] = model_path
    if checkpoint is not None:
        if not family.checkpoint:
            raise ValueError(f"model {name!r} takes no --checkpoint")
        kwargs["checkpoint"] = checkpoint
    target = family.factory
    module_name, _, factory_name = target.partition(":")
    if not _module_exists(module_name):
        raise BackendUnavailableError(
            f"model {name!r} needs module {module_name}, which is not installed in this build"
        )
    module = importlib.import_module(module_name)
    factory = vars(module).get(factory_name)
    if not callable(factory):
        raise BackendUnavailableError(f"model {name!r}: {module_name} has no {factory_name}()")
    try:
        return factory(**kwargs)
    except FileNotFoundError as exc:
        where, hint = exc.filename or exc, family.hint
        if family.keyed == "env":  # a game world's model: the hint names its env and folder
            where = _shown_path(where)
            hint = family.hint.format(env=key, folder=where)
        raise BackendUnavailableError(
            f"model {name!r}: weights not found ({where}); {hint}") from exc


def _shown_path(where: object) -> str:
    """A missing file as the user would type it: relative to the working folder when inside
    it."""
    import os

    text = str(where)
    if os.path.isabs(text):
        rel = os.path.relpath(text)
        return text if rel.startswith("..") else rel
    return text


discover()
