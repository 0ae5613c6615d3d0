"""The worlds worldstream ships: what the training, evaluation and play commands need to know
of each (its dataset, prompt table, action factors, shipped weights). Imports are lazy, so
naming a world loads only its own modules."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

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
    the prompt table the recorder's prompt indices point into; ``change_weight``: the training
    recipe's extra loss weight where a frame differs from its memory base
    (``engine.training.train_world.change_map``); ``base_warp``: the name in
    :data:`BASE_WARPS` of the warp that moves each frame's memory picture before it is encoded
    (None: the picture as read); ``backdrop_ref``: ``module:function`` of the world's
    background plate, ``(scene index, world seed) -> (S, S, 3) uint8`` (None: the world has
    none, its camera moves over the scene); ``transposable``: its episodes seen with x and y
    swapped are episodes of the same kind (``recorder.transpose_shard``: a plane seen from
    above, not a face), so ``train-world --transposed-copies`` may add them."""

    name: str
    assets: Path
    data: Path
    view_box: int
    num_actions: int
    action_factors: tuple[int, ...] | None
    dataset_module: str
    prompts_ref: str
    change_weight: float = 0.0
    base_warp: str | None = None
    backdrop_ref: str | None = None
    transposable: bool = False

    def ensure_dataset(self, root: Path | None = None,
                       workers: int = 1) -> tuple[list[Path], Path]:
        """Record missing shards (in ``workers`` processes); ``(training shard dirs, held-out
        shard dir)``."""
        module = importlib.import_module(self.dataset_module)
        return module.ensure_dataset(root or self.data, workers=workers)

    @property
    def prompts(self) -> tuple[str, ...]:
        return _import_ref(self.prompts_ref)

    @property
    def backdrop(self) -> Callable[[int, int], np.ndarray] | None:
        """The world's background plate by (scene index, world seed), or None."""
        return None if self.backdrop_ref is None else _import_ref(self.backdrop_ref)


def _import_ref(ref: str):
    """The object a ``module:name`` reference names (imported lazily)."""
    module, name = ref.split(":")
    return getattr(importlib.import_module(module), name)


WORLDS: dict[str, WorldSpec] = {
    "landscape": WorldSpec("landscape", ASSETS / "builtin", Path("data_v2"), SPRITE + 6,
                           LANDSCAPE_ACTIONS, None,
                           "worldstream.engine.training.data",
                           "worldstream.engine.worlds.recorder:PROMPTS", transposable=True),
    "avatar": WorldSpec("avatar", ASSETS / "avatar", Path("data_avatar"), 0, AVATAR_ACTIONS,
                        AVATAR_FACTORS,
                        "worldstream.engine.training.avatar_data",
                        "worldstream.engine.worlds.avatar.looks:PROMPTS", change_weight=4.0,
                        backdrop_ref="worldstream.engine.worlds.avatar.simulator:scene_backdrop"),
}


#: base warps by name (``module:Class``): a class taking the frame size (px) whose instances
#: have ``rest`` (the pose of a stream's first frames), ``path(pose, actions)`` (each frame's
#: pose) and ``apply(picture, pose, backdrop=None)`` (the memory picture moved to a pose,
#: what it uncovers shown from a background plate where given)
BASE_WARPS = {"head": "worldstream.engine.worlds.avatar.head_warp:HeadWarp",
              "head_layer": "worldstream.engine.worlds.avatar.head_warp:LayeredHeadWarp",
              "head_rig": "worldstream.engine.worlds.avatar.head_warp:RigHeadWarp",
              "head_rig_fit": "worldstream.engine.worlds.avatar.head_warp:FittedRigHeadWarp",
              "head_rig_bridge":
                  "worldstream.engine.worlds.avatar.head_warp:BridgedRigHeadWarp"}


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
