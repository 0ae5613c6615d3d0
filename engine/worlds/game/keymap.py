"""A game's key map: the page's keys -> wire key names -> the env's action ids.

Derived from the env's action meanings (``LEFT``, ``RIGHTFIRE``, ``MOVE_FORWARD``, ``do``) and
editable as a small JSON file::

    {"env": "ALE/Breakout-v5",
     "keys": {"ArrowLeft": "left", "ArrowRight": "right", "Space": "fire", ...},
     "actions": {"": "NOOP", "fire": "FIRE", "right": "RIGHT", "left": "LEFT"}}

``keys`` maps W3C ``KeyboardEvent.code`` values to wire key names (what an ``action`` message
carries); ``actions`` maps each held set of wire keys (sorted, joined by ``+``; ``""`` when
idle) to one of the env's action meanings.
"""

from __future__ import annotations

import itertools
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from worldstream.engine.core.limits import WIRE_KEY_PATTERN

#: wire key -> the words of action meanings that stand for it (lower case)
SYNONYMS: dict[str, tuple[str, ...]] = {
    "up": ("up", "forward", "move_up", "move_forward", "jump"),
    "down": ("down", "backward", "move_down", "move_backward", "crouch"),
    "left": ("left", "move_left", "turn_left"),
    "right": ("right", "move_right", "turn_right"),
    "fire": ("fire", "attack", "shoot", "do", "use"),
}
#: browser keys of the wire keys above (arrows and WASD both steer)
DIRECTION_CODES: dict[str, str] = {
    "ArrowUp": "up", "KeyW": "up", "ArrowDown": "down", "KeyS": "down",
    "ArrowLeft": "left", "KeyA": "left", "ArrowRight": "right", "KeyD": "right",
    "Space": "fire",
}
#: browser keys handed to the remaining actions, in order
EXTRA_CODES: tuple[str, ...] = (
    "KeyE", "KeyQ", "KeyR", "KeyF", "KeyZ", "KeyX", "KeyC", "KeyV", "KeyT", "KeyG",
    *(f"Digit{i}" for i in range(1, 10)), "Digit0", "KeyY", "KeyH", "KeyB", "KeyN",
)
#: the largest key map file read (a full keyboard's map is a few KB)
MAX_KEYMAP_BYTES = 256 * 2**10

_ALE_TOKENS = ("noop", "fire", "up", "down", "left", "right")
_NOOP = ("noop", "none", "idle", "nothing", "0")
_WIRE_NAME = re.compile(WIRE_KEY_PATTERN)  # what an action message may carry
_CODE = re.compile(r"^[A-Za-z0-9]{1,24}$")


class KeyMapError(ValueError):
    """A key map that does not fit its env (the message names the entry and what is
    expected)."""


def _ale_tokens(word: str) -> list[str] | None:
    """``"upleftfire"`` -> ``["up", "left", "fire"]``; None when it is not made of ALE's
    words."""
    out, rest = [], word
    while rest:
        token = next((t for t in _ALE_TOKENS if rest.startswith(t)), None)
        if token is None:
            return None
        out.append(token)
        rest = rest[len(token):]
    return out


def meaning_keys(meaning: str) -> frozenset[str] | None:
    """The wire keys an action meaning stands for (empty for a no-op), or None when its words
    are not keys of ``SYNONYMS``."""
    word = meaning.strip().lower()
    if word in _NOOP:
        return frozenset()
    for key, words in SYNONYMS.items():
        if word in words:
            return frozenset({key})
    tokens = _ale_tokens(word.replace("_", ""))
    if tokens is None:
        return None
    return frozenset(t for t in tokens if t != "noop")


def combo(keys: frozenset[str] | set[str]) -> str:
    """The ``actions`` entry name of a held set: sorted wire keys joined by ``+``."""
    return "+".join(sorted(keys))


@dataclass(frozen=True)
class KeyMap:
    """``keys``: browser code -> wire key; ``actions``: combo -> action id (see module doc);
    ``meanings``: the env's action meanings (index = action id)."""

    env_id: str
    keys: dict[str, str]
    actions: dict[str, int]
    meanings: tuple[str, ...] = field(default=())

    @property
    def wire_keys(self) -> frozenset[str]:
        """Every wire key name an action message may hold."""
        return frozenset(k for c in self.actions for k in c.split("+") if k)

    def action(self, held: frozenset[str]) -> int:
        """The action id for held wire keys: the exact combo, else the largest held subset
        that has one (so left+right is whichever the map lists, never an error), else the
        idle action. ValueError naming any key this game does not have."""
        unknown = set(held) - self.wire_keys
        if unknown:
            raise ValueError(f"keys {sorted(unknown)} are not keys of this game; it has "
                             f"{sorted(self.wire_keys)}")
        for size in range(len(held), -1, -1):
            for subset in itertools.combinations(sorted(held), size):
                found = self.actions.get(combo(set(subset)))
                if found is not None:
                    return found
        return self.actions.get("", 0)

    def to_json(self) -> dict:
        return {"env": self.env_id, "keys": dict(self.keys),
                "actions": {c: self.meanings[a] if self.meanings else a
                            for c, a in self.actions.items()}}

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=1) + "\n")


def shipped(env_id: str, meanings: tuple[str, ...]) -> KeyMap | None:
    """The key map shipped with the named game world that plays ``env_id``
    (``assets/<world>/keymap.json``), None where there is none: the game and its learned world
    then take the same keys (a Pong paddle moves up and down in both)."""
    from worldstream.engine.core.registry import GAME_WORLDS
    from worldstream.engine.worlds.catalog import ASSETS

    name = next((w for w, e in GAME_WORLDS.items() if e == env_id), None)
    path = None if name is None else ASSETS / name / "keymap.json"
    return load(path, meanings, env_id) if path is not None and path.is_file() else None


def derive(env_id: str, meanings: tuple[str, ...] | list[str]) -> KeyMap:
    """The default key map of an env from its action meanings: direction and fire words to
    arrows/WASD and Space, every other action to a key of its own (E, Q, R, F, ...)."""
    meanings = tuple(meanings)
    actions: dict[str, int] = {}
    extras: list[int] = []
    for index, meaning in enumerate(meanings):
        keys = meaning_keys(meaning)
        if keys is None or combo(keys) in actions:
            extras.append(index)
        else:
            actions[combo(keys)] = index
    used_wire = {k for c in actions for k in c.split("+") if k}
    codes = {c: w for c, w in DIRECTION_CODES.items() if w in used_wire}
    if len(extras) > len(EXTRA_CODES):
        raise KeyMapError(f"env {env_id!r} has {len(meanings)} actions; a derived key map "
                          f"covers at most {len(EXTRA_CODES) + 5 * 3}: write one by hand")
    taken = set(actions)
    for code, index in zip(EXTRA_CODES, extras, strict=False):
        name = re.sub(r"[^a-z0-9_]", "_", meanings[index].lower())[:32] or f"a{index}"
        while name in taken or name in SYNONYMS:
            name = f"{name}_{index}"[:32]
        taken.add(name)
        actions[name] = index
        codes[code] = name
    return KeyMap(env_id, codes, actions, meanings)


def from_json(data: dict, meanings: tuple[str, ...] | list[str], env_id: str) -> KeyMap:
    """A key map read from its JSON form, checked against the env: KeyMapError naming an
    action the env lacks, a wire key no browser key sends, or a malformed entry."""
    meanings = tuple(meanings)
    if not isinstance(data, dict) or not isinstance(data.get("keys"), dict) or \
            not isinstance(data.get("actions"), dict):
        raise KeyMapError('a key map is a JSON object with "keys" and "actions" objects')
    if data.get("env") not in (None, env_id):
        raise KeyMapError(f"the key map is for env {data['env']!r}, not {env_id!r}")
    keys: dict[str, str] = {}
    for code, wire in data["keys"].items():
        if not _CODE.fullmatch(str(code)) or not isinstance(wire, str) or \
                not _WIRE_NAME.fullmatch(wire):
            raise KeyMapError(f"key map entry {code!r}: {wire!r}: expected a KeyboardEvent.code "
                              "and a wire key name of [a-z0-9_]")
        keys[code] = wire
    actions: dict[str, int] = {}
    for name, meaning in data["actions"].items():
        parts = [p for p in str(name).split("+") if p]
        if any(not _WIRE_NAME.fullmatch(p) for p in parts):
            raise KeyMapError(f"key map action {name!r}: wire keys are [a-z0-9_] joined by +")
        if isinstance(meaning, int) and not isinstance(meaning, bool):
            index = meaning
        elif meaning in meanings:
            index = meanings.index(meaning)
        else:
            raise KeyMapError(f"key map action {name!r} names {meaning!r}, which env {env_id!r} "
                              f"lacks; its actions are {list(meanings)}")
        if not 0 <= index < len(meanings):
            raise KeyMapError(f"key map action {name!r}: action id {index} outside "
                              f"[0, {len(meanings)})")
        actions[combo(set(parts))] = index
    wire = {k for c in actions for k in c.split("+") if k}
    if not wire:  # no keys of its own: the wire would take the direction keys instead
        raise KeyMapError('the key map has no keys: "actions" needs at least one held key')
    unsent = wire - set(keys.values())
    if unsent:
        raise KeyMapError(f"no browser key sends {sorted(unsent)}: add them to \"keys\"")
    return KeyMap(env_id, keys, actions, meanings)


def load(path: str | Path, meanings: tuple[str, ...] | list[str], env_id: str) -> KeyMap:
    """``from_json`` of a file; KeyMapError for unreadable JSON."""
    from worldstream.engine.core.reader import read_json_file

    try:
        data = read_json_file(path, MAX_KEYMAP_BYTES, what="key map")
    except ValueError as exc:  # too large, too deep, not UTF-8, not JSON, unreadable
        raise KeyMapError(f"cannot read key map: {exc}") from None
    return from_json(data, meanings, env_id)
