"""The built-in landscape's colour prior: what colour ground far from a view has, per scene.

The colour anchor (``BuiltinConfig.colour_anchor``) holds the generated ground's running mean
colour near a reference. A view's own mean colour is a poor reference for ground far away; the
scene's mean colour predicts it better. The best linear predictor from both, fitted on training
worlds (``engine.training.colour_prior.fit_colour_prior``), is

    reference = scene_mean + view_weight * (view_mean - scene_mean)

a shrinkage estimate (James-Stein style) of the ground's colour toward the scene's (the fit is
in the model card). Stored beside the weights as ``colour_prior.json``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from worldstream.engine.core.reader import MAX_META_BYTES, read_json_file
from worldstream.engine.worlds.scenes import SCENE_NAMES

FILENAME = "colour_prior.json"


@dataclass
class ColourPrior:
    """Per-scene mean colours (RGB levels, 0-255) and the weight a view's own mean keeps.

    ``scene_means``: scene name -> ``(r, g, b)`` mean colour of the scene's frames on
    training worlds. ``view_weight`` in [0, 1]: 0 trusts the scene alone, 1 the view alone.
    ``source``: how it was fitted (command and data), for the model card.
    ValueError for a scene the landscape does not have, a weight outside [0, 1] or a colour
    that is not a sequence of three levels in [0, 255].
    """

    scene_means: dict[str, tuple[float, float, float]]
    view_weight: float
    source: str = field(default="", compare=False)

    def __post_init__(self):
        if not (_is_level(self.view_weight) and 0.0 <= self.view_weight <= 1.0):
            raise ValueError(f"view_weight must be in [0, 1], got {self.view_weight!r}")
        for scene, colour in self.scene_means.items():
            if scene not in SCENE_NAMES:
                raise ValueError(f"unknown scene {scene!r}; expected one of {SCENE_NAMES}")
            if not (isinstance(colour, (list, tuple)) and len(colour) == 3
                    and all(_is_level(v) and 0.0 <= v <= 255.0 for v in colour)):
                raise ValueError(f"scene {scene!r}: mean colour must be 3 levels in [0, 255], "
                                 f"got {colour!r}")

    def reference(self, view_mean: np.ndarray, scene: str) -> np.ndarray:
        """The colour reference ``(3,)`` float64 for a stream of ``scene`` whose view has mean
        colour ``view_mean (3,)`` (RGB levels): the view shrunk toward the scene's mean by
        ``view_weight``; the view's mean unchanged for a scene the prior does not know."""
        view_mean = np.asarray(view_mean, np.float64)
        if scene not in self.scene_means:
            return view_mean
        prior = np.asarray(self.scene_means[scene], np.float64)
        return prior + self.view_weight * (view_mean - prior)

    def save(self, path: str | Path) -> None:
        """Write it as JSON to ``path``."""
        Path(path).write_text(json.dumps({
            "scene_means": {k: [round(float(v), 3) for v in c]
                            for k, c in self.scene_means.items()},
            "view_weight": round(float(self.view_weight), 4),
            "source": self.source,
        }, indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> ColourPrior:
        """Read one written by :meth:`save`. FileNotFoundError for a missing file, ValueError
        naming the file for one that does not hold a prior."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"colour prior file missing: {path} (fit it with "
                                    "`worldstream fit-colour-prior`, or restore it from git)")
        try:
            raw = read_json_file(path, MAX_META_BYTES)
            means = {k: tuple(c) if isinstance(c, list) else c
                     for k, c in raw["scene_means"].items()}
            return cls(means, raw["view_weight"], str(raw.get("source") or ""))
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise ValueError(f"could not read a colour prior from {path}: {err}") from err


def _is_level(value) -> bool:
    """A finite real number (a bool is not one)."""
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))
