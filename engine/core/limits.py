"""The contract's vocabulary and limits, defined once: the wire schema
(``streaming.messages``), the engine core and every backend read them from here.

The wire contract itself (``streaming/PROTOCOL.md``) names the fields; the ranges below are what
this implementation admits, documented in ``streaming/PROTOCOL_EXTENSIONS.md``.
"""

from __future__ import annotations

from typing import Any

#: the direction keys an ``action`` message may hold; a backend maps held keys to its own
#: actions (the built-in world: 9 direction ids; Wan: none)
DIRECTION_KEYS: tuple[str, ...] = ("up", "down", "left", "right")
#: a key name of a backend that declares its own (``wire_keys``: a game's ``fire``, ...)
WIRE_KEY_PATTERN = r"^[a-z0-9_]{1,32}$"

#: characters of a prompt (each of a blend's two)
MAX_PROMPT_CHARS = 400
#: denoising steps per chunk (1-4: the few-step distilled schedules of Self-Forcing/CausVid)
MAX_STEPS = 4
#: frames per chunk a client may ask for; a model generates only its own sizes
MAX_CHUNK_FRAMES = 16
#: branches of one fork (previews generated side by side)
MAX_FORK_BRANCHES = 4
#: chunks one rewind may go back (a model keeps fewer: its ``rewind_chunks``)
MAX_REWIND_CHUNKS = 64
#: frames of past context a session may ask its model to attend (``memory_frames``); a model
#: admits from one chunk up to its window
MIN_MEMORY_FRAMES = 1
MAX_MEMORY_FRAMES = 1024
#: characters of an ``attention`` setting (a kernel backend name)
MAX_ATTENTION_CHARS = 32
#: characters of an avatar's ``say`` text (about 15 s of speech)
MAX_SAY_CHARS = 200
#: the largest pointer delta of one ``action`` message, CSS pixels per axis (a page sends its
#: motion every few tens of ms: a fast flick is a few hundred pixels; more is a bad value)
MAX_POINTER_DELTA = 2048.0
#: the largest seed, frame index and fork counter a file (save point, input log) may hold: an
#: int64 (numpy and torch generators take it)
MAX_SEED = 2**63 - 1


def check_prompt(text: object, name: str = "prompt") -> str:
    """The stripped prompt; ValueError (naming ``name``) when it is not a string, blank, or
    longer than ``MAX_PROMPT_CHARS``."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"{name} must be a non-empty string")
    if len(text) > MAX_PROMPT_CHARS:
        raise ValueError(f"{name} is {len(text)} characters; the limit is {MAX_PROMPT_CHARS}")
    return text.strip()


def check_json(raw: bytes | str, name: str, limit: int) -> Any:
    """The decoded JSON text ``raw``; ValueError (one line naming ``name``) when it is longer
    than ``limit`` bytes (characters for a str), nested too deep or not valid JSON
    (:func:`engine.core.reader.read_json`)."""
    from worldstream.engine.core.reader import read_json

    return read_json(raw, name, limit)


def heavier_prompt(text: str, blend_text: str | None, blend_weight: float) -> str:
    """The prompt of a blend that weighs more (``blend_text`` when its weight is above 0.5),
    as given: for a backend that shows one prompt at a time. ValueError when either prompt
    fails :func:`check_prompt` or the weight is outside [0, 1]."""
    check_prompt(text)
    if blend_text is not None:
        check_prompt(blend_text, "blend prompt")
    if not 0.0 <= blend_weight <= 1.0:
        raise ValueError(f"blend weight must be in [0, 1], got {blend_weight}")
    return blend_text if blend_text is not None and blend_weight > 0.5 else text


def check_keys(keys: object) -> frozenset[str]:
    """The held keys as a frozenset; ValueError naming any key outside ``DIRECTION_KEYS``."""
    if isinstance(keys, str) or not hasattr(keys, "__iter__"):
        raise ValueError(f"keys must be a list of {list(DIRECTION_KEYS)}, got {keys!r}")
    held = frozenset(keys)  # type: ignore[arg-type]
    unknown = held - set(DIRECTION_KEYS)
    if unknown:
        raise ValueError(
            f"unknown key(s) {sorted(map(str, unknown))}; expected a subset of "
            f"{sorted(DIRECTION_KEYS)}"
        )
    return held
