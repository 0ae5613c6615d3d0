"""The worlds worldstream ships: what the training, evaluation and play commands need to know
of each (its dataset, prompt table, action factors, shipped weights). Imports are lazy, so
naming a world loads only its own modules."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path

from worldstream.engine.worlds.actions import NUM_ACTIONS as LANDSCAPE_ACTIONS
from worldstream.engine.worlds.avatar.actions import ACTION_FACTORS as AVATAR_FACTORS
from worldstream.engine.worlds.avatar.actions import NUM_ACTIONS as AVATAR_ACTIONS
from worldstream.engine.worlds.simulator import SPRITE

ASSETS = Path(__file__).resolve().parents[2] / "assets"


@dataclass(frozen=True)
class WorldSpec:
    """``assets``: folder of the shipped weights (``vae/``, ``transformer/``); ``data``: default
    dataset folder; ``view_box``: side (px) of the view-anchored square never written to the
    spatial memory (the landscape's player sprite plus a 3-px margin; 0 = none);
    ``num_actions``/``action_factors``: the model's action ids (factors None: plain ids);
    ``dataset_module``: where ``ensure_dataset`` lives; ``prompts_ref``: ``module:NAME`` of
    the prompt table the recorder's prompt indices point into."""

    name: str
    assets: Path
    data: Path
    view_box: int
    num_actions: int
    action_factors: tuple[int, ...] | None
    dataset_module: str
    prompts_ref: str

    def ensure_dataset(self, root: Path | None = None,
                       workers: int = 1) -> tuple[list[Path], Path]:
        """Record missing shards (in ``workers`` processes); ``(training shard dirs, held-out
        shard dir)``."""
        module = importlib.import_module(self.dataset_module)
        return module.ensure_dataset(root or self.data, workers=workers)

    @property
    def prompts(self) -> tuple[str, ...]:
        return _import_ref(self.prompts_ref)


def _import_ref(ref: str):
    """The object a ``module:name`` reference names (imported lazily)."""
    module, name = ref.split(":")
    return getattr(importlib.import_module(module), name)


WORLDS: dict[str, WorldSpec] = {
    "landscape": WorldSpec("landscape", ASSETS / "builtin", Path("data_v2"), SPRITE + 6,
                           LANDSCAPE_ACTIONS, None,
                           "worldstream.engine.training.data",
                           "worldstream.engine.worlds.recorder:PROMPTS"),
    "avatar": WorldSpec("avatar", ASSETS / "avatar", Path("data_avatar"), 0, AVATAR_ACTIONS,
                        AVATAR_FACTORS,
                        "worldstream.engine.training.avatar_data",
                        "worldstream.engine.worlds.avatar.looks:PROMPTS"),
}


#: base warps by name (``module:Class``): a class taking the frame size (px) whose instances
#: have ``rest`` (the pose of a stream's first frames), ``path(pose, actions)`` (each frame's
#: pose) and ``apply(picture, pose)`` (the memory picture moved to a pose); the
#: shipped avatar model's rig is the only one
BASE_WARPS = {"head_rig_fit": "worldstream.engine.worlds.avatar.head_rig:FittedRigHeadWarp"}


def make_base_warp(name: str, size: int):
    """A new base warp ``name`` (:data:`BASE_WARPS`) for frames of ``size`` px; ValueError
    listing the names."""
    if name not in BASE_WARPS:
        raise ValueError(f"unknown base warp {name!r}; expected one of {tuple(BASE_WARPS)}")
    return _import_ref(BASE_WARPS[name])(size)


def world(name: str) -> WorldSpec:
    """The spec of world ``name``; ValueError listing the worlds."""
    if name not in WORLDS:
        raise ValueError(f"unknown world {name!r}; expected one of {tuple(WORLDS)}")
    return WORLDS[name]
