"""Fitting the landscape's colour prior (:class:`ColourPrior`) on training worlds.

For every scene and training world seed the simulator is walked by the recorder's human-like
policy for ``length`` frames. Three mean colours come out of each walk: the start view's
(frame 0, what a stream starts from), the far ground's (the last ``far`` frames) and the
walk's (frames ``skip`` on). A scene's mean is the mean of its walks'; the view weight is the
least-squares slope of the far ground's colour on the start view's, both taken from the
scene's mean, pooled over scenes, seeds and channels — the best linear predictor of the
colour of ground far away from the colour of a view.

The shipped prior (``assets/builtin/colour_prior.json``, ``worldstream fit-colour-prior``) is
fitted with the constants below.
"""

from __future__ import annotations

import numpy as np
from tqdm import tqdm

from worldstream.engine.models.builtin.colour_prior import ColourPrior
from worldstream.engine.worlds.recorder import HumanLikePolicy
from worldstream.engine.worlds.scenes import SCENE_NAMES
from worldstream.engine.worlds.simulator import WorldSimulator

#: training world seeds 0..WORLDS-1, each walked in every scene
WORLDS = 20
#: frames of each walk
LENGTH = 3000
#: the walk's last FAR frames are the far ground
FAR = 100
#: a scene's mean is taken from frame SKIP on, past the start view
SKIP = 200


def walk_colours(seed: int, scene: str, length: int, far: int, skip: int
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean colours ``(3,)`` float64 (RGB levels) of the start view (frame 0), the last
    ``far`` frames and frames ``skip``.. of a ``length``-frame human-like walk of world
    ``seed`` in ``scene`` (the policy seeded by ``[seed, 5]``)."""
    sim = WorldSimulator(seed, scene)
    policy = HumanLikePolicy(np.random.default_rng([seed, 5]))
    means = np.empty((length, 3))
    for i in range(length):
        means[i] = sim.step(policy()).reshape(-1, 3).mean(axis=0)
    return means[0], means[-far:].mean(axis=0), means[skip:].mean(axis=0)


def fit_colour_prior(seeds: list[int], length: int = LENGTH, far: int = FAR, skip: int = SKIP,
                     scenes: tuple[str, ...] = SCENE_NAMES) -> ColourPrior:
    """The prior of ``scenes`` fitted on walks of the training worlds ``seeds`` (see the
    module). ValueError for no seeds, or ``far``/``skip`` not within the walk."""
    if not seeds:
        raise ValueError("fit_colour_prior needs at least one seed")
    if not (0 < far <= length and 0 <= skip < length):
        raise ValueError(f"need 0 < far <= length and 0 <= skip < length, got far={far}, "
                         f"skip={skip}, length={length}")
    scene_means, views, fars = {}, [], []
    with tqdm(total=len(scenes) * len(seeds), desc="colour prior", unit="walk") as bar:
        for scene in scenes:
            walks = []
            for seed in seeds:
                walks.append(walk_colours(seed, scene, length, far, skip))
                bar.update()
            view, far_ground, walk = (np.array(x) for x in zip(*walks))
            mean = walk.mean(axis=0)
            scene_means[scene] = tuple(float(v) for v in mean)
            views.append(view - mean)
            fars.append(far_ground - mean)
    x, y = np.concatenate(views).ravel(), np.concatenate(fars).ravel()
    weight = float(np.clip(x @ y / max(float(x @ x), 1e-12), 0.0, 1.0))
    source = (f"fit_colour_prior: {len(seeds)} training worlds per scene (seeds {min(seeds)}-"
              f"{max(seeds)}), human-like walks of {length} frames, far ground the last {far}, "
              f"scene means from frame {skip}")
    return ColourPrior(scene_means, weight, source)


def fit_shipped_prior() -> ColourPrior:
    """The prior of the module's constants: seeds ``0..WORLDS-1``, walks of ``LENGTH`` frames,
    the far ground the last ``FAR``, scene means from frame ``SKIP``."""
    return fit_colour_prior(list(range(WORLDS)), LENGTH, FAR, SKIP)
