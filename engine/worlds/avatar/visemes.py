"""Speech text -> a timed viseme track (one mouth shape per frame) at a speaking rate.

Letters map to visemes (mouth shapes) by spelling, with the common digraphs (``th``, ``sh``,
``ch``, ``ee``, ``oo``, ``ou``) taken as one sound; there is no pronunciation dictionary, so the
track follows spelling as a puppeteer would. Durations, in seconds at ``rate`` 1.0: a vowel
0.15 s, a consonant 0.10 s, a gap between words 0.05 s of rest, a comma 0.20 s, a sentence end
0.30 s. At 20 fps that is 3 frames a vowel and 2 a consonant (about 12 letters a second).
"""

from __future__ import annotations

import unicodedata

import numpy as np

from worldstream.engine.core.limits import MAX_SAY_CHARS

#: viseme names, in id order; ``VISEME_SHAPES[name] = (openness, width)`` (openness 0-1 of the
#: jaw, width relative to the neutral mouth)
VISEMES: tuple[str, ...] = ("rest", "MBP", "AA", "E", "I", "O", "U", "FV", "CONS")
VISEME_SHAPES: dict[str, tuple[float, float]] = {
    "rest": (0.0, 1.0),
    "MBP": (0.0, 0.9),
    "AA": (1.0, 1.05),
    "E": (0.6, 1.15),
    "I": (0.35, 1.2),
    "O": (0.75, 0.7),
    "U": (0.3, 0.55),
    "FV": (0.15, 1.0),
    "CONS": (0.25, 1.0),
}
REST = VISEMES.index("rest")
NUM_VISEMES = len(VISEMES)
#: openness of each viseme id, ``(NUM_VISEMES,)`` float32 (the lip-sync reference curve)
VISEME_OPEN = np.array([VISEME_SHAPES[v][0] for v in VISEMES], np.float32)
VISEME_WIDTH = np.array([VISEME_SHAPES[v][1] for v in VISEMES], np.float32)

VOWEL_S, CONSONANT_S, WORD_GAP_S, COMMA_S, STOP_S = 0.15, 0.10, 0.05, 0.20, 0.30

_DIGRAPHS = {"th": "CONS", "sh": "CONS", "ch": "CONS", "ee": "I", "oo": "U", "ou": "U"}
_LETTERS = {
    **dict.fromkeys("a", "AA"), **dict.fromkeys("e", "E"), **dict.fromkeys("iy", "I"),
    **dict.fromkeys("o", "O"), **dict.fromkeys("uw", "U"), **dict.fromkeys("mbp", "MBP"),
    **dict.fromkeys("fv", "FV"), **dict.fromkeys("cdghjklnqrstxz0123456789", "CONS"),
}
_VOWELS = {"AA", "E", "I", "O", "U"}


def _normalise(text: str) -> str:
    """Lower case with accents stripped (``é`` -> ``e``)."""
    decomposed = unicodedata.normalize("NFKD", text.lower())
    return "".join(ch for ch in decomposed if not unicodedata.combining(ch))


def check_say(text: str) -> str:
    """``text`` if it is sayable: a str of 1-``MAX_SAY_CHARS`` characters with at least one
    letter or digit. ValueError naming the problem otherwise."""
    if not isinstance(text, str):
        raise ValueError(f"say text must be a string, got {type(text).__name__}")
    if len(text) > MAX_SAY_CHARS:
        raise ValueError(f"say text is {len(text)} characters; at most {MAX_SAY_CHARS}")
    if not any(ch in _LETTERS for ch in _normalise(text)):
        raise ValueError("say text has no letter or digit to speak")
    return text


def text_to_visemes(text: str, fps: float = 20.0, rate: float = 1.0) -> np.ndarray:
    """The viseme track of ``text``: ``(N,)`` int8 viseme ids, one per frame at ``fps``, spoken
    at ``rate`` times the base speed; every sound lasts at least one frame, and the track ends
    with a stop's rest (0.3 s) after the last sound. Letters not in the table (other scripts,
    symbols) are skipped. ValueError for text :func:`check_say` refuses, or a non-positive
    ``fps``/``rate``."""
    check_say(text)
    if not fps > 0 or not rate > 0:
        raise ValueError(f"fps and rate must be positive, got fps={fps}, rate={rate}")
    units: list[tuple[str, float]] = []  # (viseme name, seconds)
    s, i = _normalise(text), 0
    while i < len(s):
        pair = s[i : i + 2]
        if pair in _DIGRAPHS:
            name, i = _DIGRAPHS[pair], i + 2
        else:
            ch, i = s[i], i + 1
            if ch in _LETTERS:
                name = _LETTERS[ch]
            elif ch in ".!?":
                units.append(("rest", STOP_S))
                continue
            elif ch in ",;:":
                units.append(("rest", COMMA_S))
                continue
            elif ch.isspace() or ch == "-":
                units.append(("rest", WORD_GAP_S))
                continue
            else:
                continue
        units.append((name, VOWEL_S if name in _VOWELS else CONSONANT_S))
    units.append(("rest", STOP_S))
    # frame boundaries from the running time (half up), so rounding never accumulates; every
    # sound shows for at least one frame (at high rates the track runs a little long)
    ends = np.floor(np.cumsum([sec for _, sec in units]) * fps / rate + 0.5).astype(int)
    counts = np.maximum(np.diff(ends, prepend=0), 1)
    ids = [VISEMES.index(name) for name, _ in units]
    return np.repeat(np.asarray(ids, np.int8), counts)
