"""Scenes of the built-in world: palettes over one shared terrain, and prompt paraphrases.

Every scene colours the same terrain classes (deep water, shallow water, shore, ground,
ground variant, vegetation, rock) differently, so a scene switch recolours the world in place.
"""

from __future__ import annotations

import numpy as np

# terrain classes, in the order of the palette rows
DEEP, SHALLOW, SHORE, GROUND, GROUND2, VEGETATION, ROCK = range(7)
NUM_CLASSES = 7

SCENES: dict[str, dict] = {
    "meadow": {
        "palette": [
            (28, 70, 160),
            (55, 120, 200),
            (200, 190, 120),
            (80, 160, 60),
            (110, 185, 70),
            (30, 100, 35),
            (120, 120, 110),
        ],
        "creature": (240, 240, 240),
        "cloud": 0.55,
        "prompts": [
            "a green meadow with ponds",
            "a grassy field with small lakes",
            "lush green grassland seen from above",
            "a sunny meadow with trees and water",
            "rolling green pastures",
            "a top-down view of a summer meadow",
            "a field of grass with scattered bushes",
            "green countryside with blue ponds",
            "a peaceful meadow in spring",
            "an open grassland with a few trees",
            "bright green fields and forest patches",
            "a pastoral landscape of grass and lakes",
        ],
    },
    "desert": {
        "palette": [
            (20, 110, 130),
            (60, 170, 170),
            (235, 215, 150),
            (220, 180, 100),
            (200, 150, 80),
            (70, 130, 50),
            (160, 100, 60),
        ],
        "creature": (90, 50, 20),
        "cloud": 0.15,
        "prompts": [
            "a sandy desert with an oasis",
            "hot desert dunes seen from above",
            "a dry sandy wasteland with cacti",
            "golden sand dunes under the sun",
            "an arid desert landscape",
            "a top-down view of a desert with rocks",
            "orange sand and red rocks",
            "a desert with scattered oases",
            "a scorching sand sea",
            "dunes and cactus in a dry land",
            "a barren desert plain",
            "sun-baked sand and canyons",
        ],
    },
    "snow": {
        "palette": [
            (40, 70, 120),
            (150, 200, 230),
            (200, 215, 225),
            (240, 245, 250),
            (215, 225, 240),
            (40, 80, 70),
            (130, 140, 155),
        ],
        "creature": (120, 70, 40),
        "cloud": 0.4,
        "prompts": [
            "a snowy forest",
            "a frozen winter landscape with pine trees",
            "white snow fields and icy lakes",
            "a top-down view of deep snow",
            "a snow covered tundra",
            "winter wonderland with frozen ponds",
            "icy plains and snowy pines",
            "a cold arctic landscape",
            "fresh snow over hills and forest",
            "a glacier with frozen water",
            "snowfields dotted with evergreen trees",
            "a bright snowy valley",
        ],
    },
    "night": {
        "palette": [
            (5, 10, 40),
            (20, 40, 90),
            (60, 60, 80),
            (25, 35, 60),
            (35, 45, 75),
            (10, 25, 30),
            (70, 70, 90),
        ],
        "creature": (250, 230, 90),
        "cloud": 0.3,
        "prompts": [
            "a dark landscape at night",
            "a moonlit field with dark lakes",
            "night time countryside with fireflies",
            "a top-down view of land at midnight",
            "a dark blue world under the stars",
            "a shadowy night meadow",
            "nighttime terrain lit by the moon",
            "a gloomy dark forest at night",
            "fireflies over a dark field",
            "a calm night with black water",
            "a midnight landscape in deep blue",
            "darkness over hills and ponds",
        ],
    },
}

SCENE_NAMES: tuple[str, ...] = tuple(SCENES)


def palette(scene: str) -> np.ndarray:
    """``(NUM_CLASSES, 3)`` float32 RGB in [0, 255]; raises KeyError naming an unknown scene."""
    if scene not in SCENES:
        raise KeyError(f"unknown scene {scene!r}; expected one of {SCENE_NAMES}")
    return np.asarray(SCENES[scene]["palette"], dtype=np.float32)
