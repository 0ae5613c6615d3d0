"""Looks of the avatar world: a character's appearance and the scene behind it, chosen by the
prompt (each look has a dozen paraphrases, as the landscape's scenes have).

A look fixes the kinds (hair style, glasses, hat, background); the world seed jitters the
colours and proportions, so held-out seeds are new characters of a known look.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

HAIR_STYLES = ("short", "long", "bun")
HATS = (None, "beanie", "cap", "sunhat")
BACKGROUNDS = ("office", "beach", "forest", "studio", "city", "space")

LOOKS: dict[str, dict] = {
    "office": {
        "skin": (236, 196, 164), "hair": (96, 60, 32), "shirt": (60, 90, 160),
        "hair_style": "short", "glasses": True, "hat": None, "hat_colour": (0, 0, 0),
        "background": "office",
        "prompts": [
            "a person with glasses in an office",
            "an office worker with brown hair and glasses",
            "a friendly colleague at work",
            "someone in a blue shirt in front of a bookshelf",
            "a bespectacled man in his office",
            "a video call from the office",
            "a businessman with short brown hair",
            "a teacher with glasses in a classroom office",
            "an accountant at their desk",
            "a nerdy person wearing spectacles",
            "a presenter in a workplace with a window",
            "a manager in a bright office room",
        ],
    },
    "beach": {
        "skin": (200, 150, 110), "hair": (230, 200, 110), "shirt": (240, 120, 90),
        "hair_style": "long", "glasses": False, "hat": "sunhat", "hat_colour": (235, 215, 150),
        "background": "beach",
        "prompts": [
            "a blonde woman with a sun hat at the beach",
            "someone on holiday by the sea",
            "a tanned person at the seaside",
            "a beach selfie with a straw hat",
            "a surfer with long blonde hair",
            "a summer portrait by the ocean",
            "a tourist on a sandy beach",
            "a person wearing a sunhat in front of the sea",
            "vacation by the sea under a blue sky",
            "a smiling girl at the coast",
            "a lifeguard with sun-bleached hair",
            "a sunny day on the beach",
        ],
    },
    "forest": {
        "skin": (245, 214, 190), "hair": (190, 70, 30), "shirt": (120, 90, 60),
        "hair_style": "long", "glasses": False, "hat": "beanie", "hat_colour": (40, 120, 70),
        "background": "forest",
        "prompts": [
            "a redhead with a green beanie in the forest",
            "a hiker among the trees",
            "a person with red hair in the woods",
            "someone wearing a woolly hat outdoors in a forest",
            "a forest ranger",
            "a camper in a pine forest",
            "a ginger character in the woodland",
            "an explorer in a green jungle",
            "a walker on a trail between trees",
            "a lumberjack in the forest",
            "a nature lover with a knitted hat",
            "a woodland portrait with red hair",
        ],
    },
    "studio": {
        "skin": (120, 80, 55), "hair": (25, 20, 20), "shirt": (130, 60, 150),
        "hair_style": "short", "glasses": False, "hat": None, "hat_colour": (0, 0, 0),
        "background": "studio",
        "prompts": [
            "a news presenter in a studio",
            "a dark-skinned person with black hair",
            "a portrait against a grey backdrop",
            "a television host in a purple shirt",
            "a podcaster in a recording studio",
            "a studio headshot",
            "an actor under a spotlight",
            "a speaker on a plain grey background",
            "a professional photo shoot portrait",
            "a singer in a studio",
            "a man with short black hair on a plain background",
            "an interview in a broadcast studio",
        ],
    },
    "city": {
        "skin": (215, 170, 130), "hair": (200, 200, 205), "shirt": (40, 40, 45),
        "hair_style": "short", "glasses": True, "hat": "cap", "hat_colour": (200, 40, 40),
        "background": "city",
        "prompts": [
            "someone with a red cap in the city at night",
            "a grey-haired person with glasses downtown at night",
            "a street portrait with skyscrapers behind",
            "a rapper in a cap under city lights",
            "a night in the big city",
            "an urban character wearing a baseball cap",
            "a person in front of lit office towers",
            "a skyline at night behind a man with glasses",
            "a city dweller at midnight",
            "a reporter on a night street",
            "a vlogger in a black jacket in the city",
            "neon city lights and a man in a red cap",
        ],
    },
    "space": {
        "skin": (235, 225, 240), "hair": (200, 80, 200), "shirt": (220, 220, 230),
        "hair_style": "bun", "glasses": False, "hat": None, "hat_colour": (0, 0, 0),
        "background": "space",
        "prompts": [
            "an astronaut with pink hair in space",
            "a sci-fi character among the stars",
            "a space traveller in a white suit",
            "someone floating in outer space",
            "a person with a pink hair bun and a planet behind",
            "a cosmic portrait with stars",
            "a starship pilot",
            "an alien-looking person with magenta hair",
            "a galaxy background and a pale character",
            "a space station crew member",
            "a futuristic character in the cosmos",
            "a dreamy portrait under a starry sky",
        ],
    },
}

LOOK_NAMES: tuple[str, ...] = tuple(LOOKS)
#: every prompt of every look, flattened; ``PROMPT_LOOK[i]`` is the look index of PROMPTS[i]
PROMPTS: tuple[str, ...] = tuple(p for n in LOOK_NAMES for p in LOOKS[n]["prompts"])
PROMPT_LOOK: tuple[int, ...] = tuple(
    i for i, n in enumerate(LOOK_NAMES) for _ in LOOKS[n]["prompts"]
)


@dataclass(frozen=True)
class Appearance:
    """One character: colours as float32 RGB ``(3,)`` in [0, 255]; ``face_width`` scales the
    head's half-width (1.0 = 24 px); ``background`` is the ``(128, 128, 3)`` float32 scene."""

    look: str
    skin: np.ndarray
    hair: np.ndarray
    shirt: np.ndarray
    hat_colour: np.ndarray
    hair_style: str
    glasses: bool
    hat: str | None
    face_width: float
    background: np.ndarray


def _jitter(rng: np.random.Generator, colour, amount: float = 0.08) -> np.ndarray:
    c = np.asarray(colour, np.float32) * (1.0 + rng.uniform(-amount, amount, 3))
    return np.clip(c, 0, 255).astype(np.float32)


def appearance(look: str, seed: int, size: int = 128) -> Appearance:
    """The character of ``look`` for world ``seed`` (deterministic). KeyError naming an unknown
    look."""
    if look not in LOOKS:
        raise KeyError(f"unknown look {look!r}; expected one of {LOOK_NAMES}")
    spec = LOOKS[look]
    rng = np.random.default_rng([seed, 7])
    return Appearance(
        look=look,
        skin=_jitter(rng, spec["skin"]),
        hair=_jitter(rng, spec["hair"], 0.15),
        shirt=_jitter(rng, spec["shirt"], 0.15),
        hat_colour=_jitter(rng, spec["hat_colour"]),
        hair_style=spec["hair_style"],
        glasses=spec["glasses"],
        hat=spec["hat"],
        face_width=float(rng.uniform(0.92, 1.08)),
        background=background(spec["background"], rng, size),
    )


def _rect(img, x0, y0, x1, y1, colour) -> None:
    h, w = img.shape[:2]
    xa, xb, ya, yb = max(int(x0), 0), min(int(x1), w), max(int(y0), 0), min(int(y1), h)
    if xa < xb and ya < yb:
        img[ya:yb, xa:xb] = colour


def background(kind: str, rng: np.random.Generator, size: int = 128) -> np.ndarray:
    """The static scene behind the character, ``(size, size, 3)`` float32 RGB; layout and
    colours jittered by ``rng``. KeyError naming an unknown kind."""
    if kind not in BACKGROUNDS:
        raise KeyError(f"unknown background {kind!r}; expected one of {BACKGROUNDS}")
    ys, xs = np.mgrid[0:size, 0:size].astype(np.float32) / size
    v = ys[..., None]

    def grad(top, bottom):
        return (1 - v) * np.asarray(top, np.float32) + v * np.asarray(bottom, np.float32)

    j = rng.uniform(-1, 1, 8)
    if kind == "office":
        img = grad((225, 215, 190), (200, 188, 160))
        wx = 6 + 8 * j[0]
        _rect(img, wx, 14, wx + 34, 60, (170, 205, 235))
        _rect(img, wx + 16, 14, wx + 18, 60, (240, 240, 240))
        sx = 96 + 6 * j[1]
        _rect(img, sx, 10, sx + 30, 90, (120, 85, 55))
        for row in range(4):
            for k in range(5):
                col = rng.uniform(60, 220, 3)
                _rect(img, sx + 3 + 5 * k, 14 + 19 * row, sx + 7 + 5 * k, 28 + 19 * row, col)
    elif kind == "beach":
        horizon = 0.55 + 0.05 * j[0]
        sky = grad((110, 170, 235), (190, 220, 245))
        sea = np.broadcast_to(np.asarray((40, 120, 170), np.float32), sky.shape)
        sand = np.broadcast_to(np.asarray((225, 205, 150), np.float32), sky.shape)
        img = np.where(v < horizon, sky, np.where(v < horizon + 0.18, sea, sand)).copy()
        cx, cy = (0.15 + 0.1 * j[1]) * size, 0.15 * size
        sun = (xs * size - cx) ** 2 + (ys * size - cy) ** 2 < 81
        img[sun] = (255, 240, 170)
    elif kind == "forest":
        img = grad((70, 120, 70), (40, 80, 45))
        for k in range(6):
            tx = (k + 0.5) * size / 6 + 6 * j[k % 8]
            _rect(img, tx - 3, 40, tx + 3, size, (90, 60, 35))
            blob = ((xs * size - tx) / 14) ** 2 + ((ys * size - 30 - 4 * j[(k + 3) % 8]) / 18) ** 2
            img[blob < 1] = (50 + 10 * k, 140 - 5 * k, 60)
    elif kind == "studio":
        r = np.sqrt((xs - 0.5 - 0.1 * j[0]) ** 2 + (ys - 0.35) ** 2)[..., None]
        img = np.asarray((170, 170, 175), np.float32) * (1.1 - 0.8 * r)
    elif kind == "city":
        img = grad((15, 20, 55), (40, 30, 70))
        x = 0.0
        while x < size:
            w = rng.uniform(14, 26)
            top = rng.uniform(10, 60)
            _rect(img, x, top, x + w - 2, size, (30, 32, 45))
            for wy in np.arange(top + 4, size, 8):
                for wx in np.arange(x + 3, x + w - 5, 6):
                    if rng.random() < 0.45:
                        _rect(img, wx, wy, wx + 3, wy + 4, (250, 220, 110))
            x += w
    else:  # space
        img = grad((8, 8, 25), (20, 10, 40))
        stars = rng.integers(0, size, (60, 2))
        img[stars[:, 1], stars[:, 0]] = (240, 240, 255)
        cx, cy = (0.82 + 0.05 * j[0]) * size, (0.22 + 0.05 * j[1]) * size
        planet = (xs * size - cx) ** 2 + (ys * size - cy) ** 2 < 196
        img[planet] = (200, 120, 80)
    return np.clip(img, 0, 255).astype(np.float32)
