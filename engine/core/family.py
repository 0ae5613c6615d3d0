"""One model family's row: everything the commands, the engine and the replicas know about a
family, declared in one frozen dataclass (``engine.core.registry`` collects the rows).

A family declares its rows in its own folder and hands them over through the
``worldstream.families`` entry point (``engine/backends/WRITE_A_FAMILY.md``); nothing outside
its folder names it. A misspelt field is a ``TypeError`` where the row is made (a keyword the
dataclass does not have), a wrong value a ``ValueError`` naming the field
(:meth:`Family.__post_init__`), both at registration.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: what a family's key may name (``NAME:KEY``): a game's env, or a variant of the model
KEY_KINDS = ("env", "variant")


@dataclass(frozen=True)
class Family:
    """One model family (``--model``): how its backends are made and what they take.

    ``name``: the backend id (``NAME``) or, where ``keyed`` is set, the prefix of ids
    ``NAME:KEY`` (a game world's env, a model's variant); the id is what save points and input
    logs record as their model. ``factory``: ``module:callable`` taking keyword arguments and
    returning a ``WorldBackend``.

    How it is named: ``model``: its ``--model`` name (several families share one, one per
    world: the second axis beside ``--world``); ``worlds``: the worlds it plays (``--world``);
    empty: it is a world of its own (``--model NAME`` alone, no ``--world``).
    ``world_keys``: ``(world, key)`` pairs: the named worlds of a keyed family (``--world
    pong`` is the backend ``NAME:ALE/Pong-v5``); each world is also in ``worlds``.
    ``summary``: one line for ``--model``'s help.

    Its key: ``keyed``: the factory argument the key goes to (one of :data:`KEY_KINDS`);
    ``key_optional``: ``NAME`` alone is a model too (the factory's default key);
    ``variants``: the keys ``--variant`` offers (a family keyed by ``variant``).

    What it takes: ``path_argument``: the factory argument a model folder (``--model-path``)
    goes to (None: it takes none); ``checkpoint``: weights may come from a separate file
    (``--checkpoint``); ``settings``: ``module:Class``, the config dataclass whose fields
    ``--set FIELD=VALUE`` sets (None: it takes no settings); ``settings_source``:
    ``module:callable(world, model_path) -> (values, source)``, the values ``--set help``
    shows for a world and where they come from (None: the fields' defaults);
    ``play_settings``: ``(field, value)`` pairs ``play`` sets before the user's ``--set``
    (e.g. compile at start-up); ``frame_sizes``: the ``--frame-size`` values it takes
    (passed as ``frame_size``).

    What it is: ``default``: the model its worlds play when ``--model`` is not given (and a
    game given by ``--env`` with ``--model-path``); ``simulator``: the ground truth of its
    worlds, which a model of the same world that cannot load points to (and a game given by
    ``--env`` alone plays); ``prompt_encoder``: it maps prompts with the shared scene-prompt
    encoder (loaded before serving, so the first session does not stall); ``replicas``: it
    runs on Ray replicas (``play --replicas``); ``own_keys``: it declares key names of its own
    (``BackendInfo.wire_keys``) instead of the direction keys, so a replayed log may hold
    any key name. ``hint``: what to do when its weights are missing (``{env}``: the key,
    ``{folder}``: the missing folder)."""

    name: str
    factory: str
    model: str = ""
    worlds: tuple[str, ...] = ()
    world_keys: tuple[tuple[str, str], ...] = ()
    summary: str = ""
    keyed: str | None = None
    key_optional: bool = False
    variants: tuple[str, ...] = ()
    path_argument: str | None = None
    checkpoint: bool = False
    settings: str | None = None
    settings_source: str | None = None
    play_settings: tuple[tuple[str, Any], ...] = ()
    frame_sizes: tuple[str, ...] = ()
    default: bool = False
    simulator: bool = False
    prompt_encoder: bool = False
    replicas: bool = True
    own_keys: bool = False
    hint: str = ""

    def __post_init__(self) -> None:
        for field in ("name", "factory"):
            value = getattr(self, field)
            if not isinstance(value, str) or not value or ":" in value and field == "name":
                raise ValueError(f"Family.{field}: expected a non-empty string"
                                 f"{' without :' if field == 'name' else ''}, got {value!r}")
        for field in ("factory", "settings", "settings_source"):
            value = getattr(self, field)
            if value is not None and (not isinstance(value, str) or value.count(":") != 1):
                raise ValueError(f"Family {self.name!r}: {field}: expected 'module:name', "
                                 f"got {value!r}")
        for field in ("worlds", "variants", "frame_sizes", "world_keys", "play_settings"):
            if not isinstance(getattr(self, field), tuple):
                raise ValueError(f"Family {self.name!r}: {field}: expected a tuple, got "
                                 f"{type(getattr(self, field)).__name__}")
        for field in ("key_optional", "checkpoint", "default", "simulator", "prompt_encoder",
                      "replicas", "own_keys"):
            if not isinstance(getattr(self, field), bool):
                raise ValueError(f"Family {self.name!r}: {field}: expected a bool, got "
                                 f"{getattr(self, field)!r}")
        if self.keyed is not None and self.keyed not in KEY_KINDS:
            raise ValueError(f"Family {self.name!r}: keyed: expected one of {KEY_KINDS}, got "
                             f"{self.keyed!r}")
        if self.worlds and not self.model:
            raise ValueError(f"Family {self.name!r}: worlds: a family that plays worlds needs "
                             "a model name")
        if self.world_keys and self.keyed is None:
            raise ValueError(f"Family {self.name!r}: world_keys goes with keyed")
        missing = [w for w, _ in self.world_keys if w not in self.worlds]
        if missing:
            raise ValueError(f"Family {self.name!r}: world_keys: {missing} not in worlds")
        if self.keyed is not None and self.worlds and \
                len(self.world_keys) != len(self.worlds):
            raise ValueError(f"Family {self.name!r}: world_keys: a keyed family names the "
                             "key of each of its worlds")
        if self.variants and self.keyed != "variant":
            raise ValueError(f"Family {self.name!r}: variants goes with keyed='variant'")
        if self.default and self.simulator:
            raise ValueError(f"Family {self.name!r}: default and simulator exclude each other")

    @property
    def own_world(self) -> bool:
        """Whether it is a world of its own (``--model NAME`` alone, no ``--world``)."""
        return bool(self.model) and not self.worlds

    def backend_id(self, world: str | None = None) -> str:
        """The backend id that plays ``world`` (its key's id for a keyed family's named world;
        None: an own world's)."""
        keys = dict(self.world_keys)
        return f"{self.name}:{keys[world]}" if world in keys else self.name
