"""Key maps derived from the action meanings of Breakout and Pong (ale-py's own lists), their
JSON form, and key maps that do not fit their env."""

from __future__ import annotations

import json

import pytest

from worldstream.engine.worlds.game import keymap

BREAKOUT = ("NOOP", "FIRE", "RIGHT", "LEFT")
PONG = ("NOOP", "FIRE", "RIGHT", "LEFT", "RIGHTFIRE", "LEFTFIRE")


def test_breakout_keys_are_arrows_wasd_and_space():
    km = keymap.derive("ALE/Breakout-v5", BREAKOUT)
    assert km.keys == {"ArrowLeft": "left", "KeyA": "left", "ArrowRight": "right",
                       "KeyD": "right", "Space": "fire"}
    assert km.wire_keys == {"left", "right", "fire"}
    assert [km.action(frozenset(k)) for k in ((), {"fire"}, {"right"}, {"left"})] == [0, 1, 2, 3]
    # no LEFTFIRE in Breakout: the largest held subset with an action (sorted: fire first)
    assert km.action(frozenset({"left", "fire"})) == 1
    with pytest.raises(ValueError, match="not keys of this game"):
        km.action(frozenset({"up"}))


def test_pong_combines_a_direction_with_fire():
    km = keymap.derive("ALE/Pong-v5", PONG)
    assert km.action(frozenset({"right", "fire"})) == PONG.index("RIGHTFIRE")
    assert km.action(frozenset({"left", "fire"})) == PONG.index("LEFTFIRE")
    assert km.action(frozenset({"left"})) == PONG.index("LEFT")
    assert km.to_json()["actions"] == {"": "NOOP", "fire": "FIRE", "right": "RIGHT",
                                       "left": "LEFT", "fire+right": "RIGHTFIRE",
                                       "fire+left": "LEFTFIRE"}


def test_json_round_trip_and_an_edited_map(tmp_path):
    km = keymap.derive("ALE/Pong-v5", PONG)
    path = tmp_path / "pong.json"
    km.save(path)
    again = keymap.load(path, PONG, "ALE/Pong-v5")
    assert (again.keys, again.actions) == (km.keys, km.actions)
    # Pong's paddle moves up and down: an edited map puts RIGHT/LEFT on the up/down arrows
    data = json.loads(path.read_text())
    data["keys"] = {"ArrowUp": "up", "ArrowDown": "down", "Space": "fire"}
    data["actions"] = {"": "NOOP", "up": "RIGHT", "down": "LEFT", "fire": "FIRE"}
    edited = keymap.from_json(data, PONG, "ALE/Pong-v5")
    assert edited.action(frozenset({"up"})) == 2 and edited.wire_keys == {"up", "down", "fire"}


@pytest.mark.parametrize("data, message", [
    ({"keys": {"Space": "fire"}, "actions": {"fire": "JUMP"}}, "'JUMP', which env"),
    ({"keys": {"Space": "fire"}, "actions": {"fire": 9}}, "outside"),
    ({"keys": {}, "actions": {"fire": "FIRE"}}, "no browser key sends"),
    ({"keys": {"Space": "Fire!"}, "actions": {}}, "wire key name"),
    ({"env": "ALE/Pong-v5", "keys": {}, "actions": {}}, "not 'ALE/Breakout-v5'"),
    ([1, 2], "JSON object"),
])
def test_a_key_map_that_does_not_fit_its_env_is_one_line(data, message):
    with pytest.raises(keymap.KeyMapError, match=message) as err:
        keymap.from_json(data, BREAKOUT, "ALE/Breakout-v5")
    assert "\n" not in str(err.value)


def test_an_unreadable_key_map_file(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(keymap.KeyMapError, match="cannot read key map"):
        keymap.load(bad, BREAKOUT, "ALE/Breakout-v5")
