"""The built-in family's weights as a backend: its settings from a folder (``builtin_config``)
and the backend made from them (``load_builtin_backend``, the family row's factory)."""

from __future__ import annotations

from pathlib import Path

from worldstream.engine.backends.builtin.backend import BuiltinBackend
from worldstream.engine.backends.builtin.config import BuiltinConfig
from worldstream.engine.backends.settings import load_settings
from worldstream.engine.models.builtin.loading import (
    BUILTIN_DIR,
    load_autoencoder,
    load_colour_prior,
    load_world_model,
)

__all__ = ["builtin_config", "load_builtin_backend"]


def builtin_config(path: str | Path = BUILTIN_DIR, **overrides) -> BuiltinConfig:
    """The stream settings of the weights in ``path``: its ``stream_config.json`` (the
    class's defaults where it has none), the colour prior of ``path/colour_prior.json`` or
    the shipped one (the prior is the simulator's, not the weights'), then ``overrides``
    (``colour_prior=None`` leaves the prior out). ValueError naming a bad setting or file."""
    path = Path(path)
    settings = {**load_settings(BuiltinConfig, path), **overrides}
    anchored = settings.get("colour_anchor", BuiltinConfig.colour_anchor) is not None
    if "colour_prior" not in settings and anchored:
        settings["colour_prior"] = load_colour_prior(path)
    return BuiltinConfig(**settings)


def load_builtin_backend(path: str | Path = BUILTIN_DIR, **overrides) -> BuiltinBackend:
    """The weights in ``path`` (``transformer/``, ``vae/``; default the shipped landscape) as
    a backend with :func:`builtin_config`'s settings. FileNotFoundError names a missing
    weights file, ValueError a corrupt weights, prior or settings file."""
    path = Path(path)
    return BuiltinBackend(load_world_model(path / "transformer"),
                          load_autoencoder(path / "vae"), builtin_config(path, **overrides))
