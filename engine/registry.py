"""Model backends by name (``--model NAME``), imported lazily so that ``sim`` never loads torch."""

from __future__ import annotations

import importlib
import importlib.util

from worldstream.engine.backend import WorldBackend

#: name -> "module:factory"; the factory takes keyword arguments and returns a WorldBackend
_BACKENDS: dict[str, str] = {
    "sim": "worldstream.engine.worlds.sim_backend:SimBackend",
    "builtin": "worldstream.engine.generator:load_builtin_backend",
    "wan-causal": "worldstream.engine.wan_backend:load_wan_backend",
    "avatar-sim": "worldstream.engine.worlds.avatar.sim_backend:AvatarSimBackend",
    "avatar": "worldstream.engine.worlds.avatar.model_backend:load_avatar_backend",
}


#: what to do when a model's files are missing
_HINTS: dict[str, str] = {
    "builtin": "train them with `worldstream train-ae` and `worldstream train-world`, or "
               "restore the shipped assets/builtin from git",
    "avatar": "train them with `worldstream train-ae --world avatar` and `worldstream "
              "train-world --world avatar`, or restore the shipped assets/avatar from git",
    "wan-causal": "pass --model-path DIR holding the diffusers-format Wan2.1-T2V-1.3B base "
                  "(transformer/, vae/, text_encoder/, tokenizer/) and the causal checkpoint",
}


class BackendUnavailableError(RuntimeError):
    """A known model cannot be loaded here (its module or weights are missing)."""


def _module_exists(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def available_models() -> list[str]:
    """Names whose backend module is installed (the weights are checked when loading)."""
    return [name for name, target in _BACKENDS.items()
            if _module_exists(target.partition(":")[0])]


def load_backend(name: str, **kwargs) -> WorldBackend:
    """The backend ``name`` built with ``kwargs``.

    Raises ValueError for an unknown name (listing the known ones), BackendUnavailableError
    naming the missing module or weights file when a known backend cannot be loaded.
    """
    target = _BACKENDS.get(name)
    if target is None:
        raise ValueError(f"unknown model {name!r}; known models: {sorted(_BACKENDS)}")
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
        raise BackendUnavailableError(
            f"model {name!r}: weights not found ({exc.filename or exc}); {_HINTS.get(name, '')}"
        ) from exc
