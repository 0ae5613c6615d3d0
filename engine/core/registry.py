"""Model backends by name (``--model NAME``), imported lazily so that ``sim`` never loads torch."""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass

from worldstream.engine.core.backend import WorldBackend


@dataclass(frozen=True)
class Family:
    """One model family: how its backends are made and what they take.

    ``name``: the backend id (``builtin``) or, where ``keyed`` is set, the prefix of ids
    ``NAME:KEY`` (``game-sim:ALE/Pong-v5``: a game world's env; ``matrix-game-2:universal``: a
    variant). ``factory``: ``module:factory`` taking keyword arguments, returning a
    WorldBackend. ``keyed``: the factory argument the key goes to (``env``, ``variant``);
    ``key_optional``: ``NAME`` alone is a model too (the factory's default key).
    ``path_argument``: the factory argument a model folder (``--model-path``) goes to; None:
    the family takes none. ``checkpoint``: weights may come from a separate file
    (``--checkpoint``). ``hint``: what to do when its weights are missing (``{env}``: the
    game, ``{folder}``: the missing folder). ``model``: its ``--model`` name (the second axis,
    beside ``--world``); ``worlds``: the worlds it plays (``--world``; for a family keyed by
    env, the named game worlds of :data:`GAME_WORLDS` it plays, each as ``NAME:ENV``); none:
    it is a world of its own (``--model NAME`` alone). The id is what save points and input
    logs record as their model."""

    name: str
    factory: str
    keyed: str | None = None
    key_optional: bool = False
    path_argument: str | None = None
    checkpoint: bool = False
    hint: str = ""
    model: str = ""
    worlds: tuple[str, ...] = ()


#: named game worlds (``--world NAME``) -> their env
GAME_WORLDS: dict[str, str] = {"pong": "ALE/Pong-v5", "breakout": "ALE/Breakout-v5"}

FAMILIES: dict[str, Family] = {f.name: f for f in (
    Family("builtin", "worldstream.engine.backends.builtin:load_builtin_backend",
           path_argument="path", model="builtin", worlds=("landscape",),
           hint="train them with `worldstream train-ae` and `worldstream train-world`, or "
                "restore the shipped assets/builtin from git"),
    Family("sim", "worldstream.engine.backends.sim.backend:SimBackend",
           model="sim", worlds=("landscape",)),
    Family("wan-causal", "worldstream.engine.backends.wan.backend:load_wan_backend",
           path_argument="model_path", checkpoint=True, model="wan-causal",
           worlds=("landscape",),
           hint="pass --model-path DIR holding the diffusers-format Wan2.1-T2V-1.3B base "
                "(transformer/, vae/, text_encoder/, tokenizer/) and the causal checkpoint"),
    Family("avatar", "worldstream.engine.backends.avatar.backend:load_avatar_backend",
           path_argument="path", model="builtin", worlds=("avatar",),
           hint="train them with `worldstream train-ae --world avatar` and `worldstream "
                "train-world --world avatar`, or restore the shipped assets/avatar from git"),
    Family("avatar-sim", "worldstream.engine.backends.avatar.sim:AvatarSimBackend",
           model="sim", worlds=("avatar",)),
    # a simulation of a GPU model (the simulator's frames, a published model's chunk time
    # spent waiting): scale-out measured where no accelerator is (engine/backends/emulated.py)
    Family("emulated", "worldstream.engine.backends.emulated:load_emulated_backend",
           model="emulated", worlds=("landscape",)),
    # Matrix-Game 2.0 (keys and mouse, GPU): input logs record its variant,
    # matrix-game-2:universal (load_backend takes that id, or variant=)
    Family("matrix-game-2",
           "worldstream.engine.backends.matrix_game.backend:load_matrix_game_backend",
           keyed="variant", key_optional=True, path_argument="model_path",
           model="matrix-game-2",
           hint="pass --model-path DIR holding the Skywork/Matrix-Game-2.0 release "
                "(base_distilled_model/, gta_distilled_model/, templerun_distilled_model/, "
                "Wan2.1_VAE.pth, the CLIP .pth)"),
    # game worlds, FAMILY:ENV; ENV is a Gymnasium id or ``module:factory``
    Family("game-sim", "worldstream.engine.backends.game.sim:load_game_backend", keyed="env",
           model="sim", worlds=tuple(GAME_WORLDS)),
    Family("game-builtin", "worldstream.engine.backends.game.world:load_game_world_backend",
           keyed="env", path_argument="path", model="builtin", worlds=tuple(GAME_WORLDS),
           hint="train with `worldstream train --env {env} --out {folder}`"),
)}
#: the families whose key is a game's env
_ENV_FAMILIES: frozenset[str] = frozenset()
#: model family (``--model``) -> backend family of a game world (``--env ID``); ``sim`` is the
#: game itself, ``builtin`` its learned world model (a folder of ``worldstream train``)
ENV_MODELS: dict[str, str] = {}
#: (world, model family) -> backend id: the two axes of ``--world`` and ``--model``
WORLD_MODELS: dict[tuple[str, str], str] = {}
#: ``--world`` values, and the ``--model`` values of a world (``--world``, ``--env``)
WORLDS: tuple[str, ...] = ()
WORLD_MODEL_NAMES: tuple[str, ...] = ()
#: ``--model`` values that are a world of their own (Matrix-Game 2.0 starts from a picture)
OWN_WORLD_MODELS: tuple[str, ...] = ()


def _derive() -> None:
    """The tables above, from :data:`FAMILIES` (each family's row is the one place it is
    written)."""
    global _ENV_FAMILIES, WORLDS, WORLD_MODEL_NAMES, OWN_WORLD_MODELS
    _ENV_FAMILIES = frozenset(f.name for f in FAMILIES.values() if f.keyed == "env")
    ENV_MODELS.clear()
    ENV_MODELS.update({f.model: f.name for f in FAMILIES.values() if f.keyed == "env"})
    WORLD_MODELS.clear()
    for f in FAMILIES.values():
        for world in f.worlds:
            WORLD_MODELS[(world, f.model)] = (f"{f.name}:{GAME_WORLDS[world]}"
                                              if f.keyed == "env" else f.name)
    WORLDS = tuple(dict.fromkeys(w for w, _ in WORLD_MODELS))
    WORLD_MODEL_NAMES = tuple(dict.fromkeys(m for _, m in WORLD_MODELS))
    OWN_WORLD_MODELS = tuple(f.model for f in FAMILIES.values() if f.model and not f.worlds)


def register(family: Family) -> None:
    """Add a model family (its one row) to those ``--model``, ``load_backend``, input logs and
    save points know; ValueError for a name or (world, model) pair already taken."""
    taken = {(w, family.model) for w in family.worlds} & set(WORLD_MODELS)
    if family.name in FAMILIES or taken:
        raise ValueError(f"model family {family.name!r}: already registered "
                         f"({sorted(taken) or family.name})")
    FAMILIES[family.name] = family
    _derive()


_derive()


def env_backend_id(env: str, model: str = "sim") -> str:
    """The backend that plays the game ``env`` (``--env``) with model family ``model``;
    ValueError for an empty env or a family no game world has."""
    if not isinstance(env, str) or not env.strip():
        raise ValueError("--env needs a Gymnasium id (ALE/Pong-v5) or module:factory")
    family = ENV_MODELS.get(model)
    if family is None:
        raise ValueError(f"no model {model!r} for a game world (--env); there are: "
                         f"{sorted(ENV_MODELS)}")
    return f"{family}:{env.strip()}"


def takes_own_keys(name: str) -> bool:
    """Whether the backend ``name`` (as an input log records it) declares key names of its own
    instead of the direction keys: a game world, Matrix-Game 2.0 (``matrix-game-2:VARIANT``)."""
    return env_of(name) is not None or str(name).partition(":")[0] == "matrix-game-2"


def env_of(name: str) -> str | None:
    """The env of a game world's backend id (``game-sim:ALE/Pong-v5`` -> ``ALE/Pong-v5``),
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
    ``name`` may be the id an input log records: ``game-sim:ENV`` passes ``env=ENV``,
    ``matrix-game-2:VARIANT`` passes ``variant=VARIANT``.

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
    factory = getattr(module, factory_name, None)
    if factory is None:
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
