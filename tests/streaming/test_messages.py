"""Message schemas: every accepted form maps to the right engine command, every rejection names
its field and reason (one test per rejection)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from worldstream.engine.core import api
from worldstream.engine.core.limits import DIRECTION_KEYS
from worldstream.streaming import messages as m


def reject(raw) -> m.MessageError:
    with pytest.raises(m.MessageError) as info:
        m.parse_client_message(raw if isinstance(raw, str | bytes) else json.dumps(raw))
    return info.value


def test_action_maps_to_command():
    msg = m.parse_client_message(json.dumps(
        {"type": "action", "seq": 3, "t": 12.5, "keys": ["right", "up"], "pointer": [1, -2.5]}))
    # the pointer reaches the engine (a model with mouse input takes it; others ignore it)
    assert m.to_command(msg) == api.ActionCommand(3, 12.5, frozenset({"up", "right"}),
                                                  pointer=(1.0, -2.5))


def test_idle_action_has_no_keys():
    msg = m.parse_client_message('{"type":"action","seq":0,"t":0,"keys":[]}')
    assert m.to_command(msg) == api.ActionCommand(0, 0.0, frozenset())


def test_prompt_with_and_without_blend():
    plain = m.parse_client_message('{"type":"prompt","seq":1,"t":2,"text":"snow"}')
    assert m.to_command(plain) == api.PromptCommand(1, 2.0, "snow")
    blended = m.parse_client_message(json.dumps({"type": "prompt", "seq": 2, "t": 3, "text": "a",
                                                 "blend": {"text": "b", "weight": 0.25}}))
    assert m.to_command(blended) == api.PromptCommand(2, 3.0, "a", "b", 0.25)


@pytest.mark.parametrize("raw, command", [
    ({"type": "settings", "seq": 1, "steps": 2}, api.SettingsCommand(1, steps=2)),
    ({"type": "settings", "seq": 1, "fps": 12, "attention": "sparse"},
     api.SettingsCommand(1, fps=12, attention="sparse")),
    ({"type": "fork", "seq": 4, "k": 3}, api.ForkCommand(4, 3)),
    ({"type": "adopt", "seq": 5, "branch": 2}, api.AdoptCommand(5, 2)),
    ({"type": "rewind", "seq": 6, "chunks": 2}, api.RewindCommand(6, 2)),
])
def test_steering_messages_map_to_commands(raw, command):
    assert m.to_command(m.parse_client_message(json.dumps(raw))) == command


def test_transport_messages_are_not_commands():
    for raw in ('{"type":"ping","seq":1,"t":5}', '{"type":"next"}',
                '{"type":"record","seq":1,"on":true}'):
        with pytest.raises(TypeError):
            m.to_command(m.parse_client_message(raw))


# ---------------------------------------------------------------- rejections
def test_reject_too_large():
    err = reject(json.dumps({"type": "ping", "seq": 1, "t": 0, "pad": "x" * m.MAX_MESSAGE_BYTES}))
    assert (err.code, err.field) == ("too_large", "message")
    assert str(m.MAX_MESSAGE_BYTES) in err.reason


def test_size_is_counted_in_utf8_bytes():
    # 1,400 three-byte characters: 4,200+ bytes although only ~1,440 characters
    err = reject('{"type":"prompt","seq":1,"t":0,"text":"' + "€" * 1400 + '"}')
    assert err.code == "too_large"


def test_reject_not_json():
    err = reject("{not json")
    assert (err.code, err.field) == ("malformed", "message")


def test_reject_not_an_object():
    assert reject("[1, 2]").code == "malformed"


def test_reject_missing_type():
    err = reject({"seq": 4})
    assert (err.code, err.field, err.seq) == ("missing", "type", 4)


def test_reject_unknown_type():
    err = reject({"type": "teleport", "seq": 9})
    assert (err.code, err.field, err.seq) == ("unknown_type", "type", 9)
    assert "teleport" in err.reason


def test_reject_unknown_key():
    err = reject({"type": "action", "seq": 1, "t": 0, "keys": ["jump"]})
    assert (err.code, err.field) == ("literal_error", "keys.0")


def test_reject_repeated_key():
    err = reject({"type": "action", "seq": 1, "t": 0, "keys": ["up", "up"]})
    assert err.field == "keys" and "repeat" in err.reason


def test_reject_string_seq():
    err = reject({"type": "action", "seq": "1", "t": 0, "keys": []})
    assert (err.code, err.field) == ("int_type", "seq")


def test_reject_bool_seq():
    assert reject({"type": "ping", "seq": True, "t": 0}).field == "seq"


def test_reject_negative_seq():
    assert reject({"type": "ping", "seq": -1, "t": 0}).code == "greater_than_equal"


def test_reject_missing_field():
    err = reject({"type": "action", "seq": 1, "keys": []})
    assert (err.code, err.field, err.seq) == ("missing", "t", 1)


def test_reject_extra_field():
    err = reject({"type": "fork", "seq": 1, "k": 2, "turbo": True})
    assert (err.code, err.field) == ("extra_forbidden", "turbo")


def test_reject_non_finite_time():
    err = reject('{"type":"ping","seq":1,"t":NaN}')
    assert err.field == "t" and "finite" in err.reason


def test_reject_long_prompt():
    err = reject({"type": "prompt", "seq": 1, "t": 0, "text": "a" * (m.MAX_PROMPT_CHARS + 1)})
    assert (err.code, err.field) == ("string_too_long", "text")


def test_reject_blank_prompt():
    err = reject({"type": "prompt", "seq": 1, "t": 0, "text": "   "})
    assert err.field == "text" and "blank" in err.reason


def test_reject_blend_weight_out_of_range():
    err = reject({"type": "prompt", "seq": 1, "t": 0, "text": "a",
                  "blend": {"text": "b", "weight": 1.5}})
    assert (err.code, err.field) == ("less_than_equal", "blend.weight")


def test_reject_pointer_of_wrong_length():
    err = reject({"type": "action", "seq": 1, "t": 0, "keys": [], "pointer": [1]})
    assert err.field == "pointer"


@pytest.mark.parametrize("raw, field", [
    ({"type": "settings", "seq": 1, "steps": 0}, "steps"),
    ({"type": "settings", "seq": 1, "fps": 500}, "fps"),
    ({"type": "fork", "seq": 1, "k": 0}, "k"),
    ({"type": "fork", "seq": 1, "k": m.MAX_FORK_BRANCHES + 1}, "k"),
    ({"type": "adopt", "seq": 1, "branch": -1}, "branch"),
    ({"type": "rewind", "seq": 1, "chunks": 0}, "chunks"),
    ({"type": "record", "seq": 1, "on": "yes"}, "on"),
])
def test_reject_out_of_range(raw, field):
    assert reject(raw).field == field


def test_error_message_shape():
    err = reject({"type": "fork", "seq": 7, "k": 0})
    assert err.to_message() == {"type": "error", "seq": 7, "code": "greater_than_equal",
                                "field": "k", "message": "Input should be greater than or "
                                "equal to 1"}


@given(st.lists(st.sampled_from(DIRECTION_KEYS), unique=True), st.integers(0, 2**40),
       st.floats(allow_nan=False, allow_infinity=False))
def test_any_valid_action_round_trips(keys, seq, t):
    raw = json.dumps({"type": "action", "seq": seq, "t": t, "keys": keys})
    assert m.to_command(m.parse_client_message(raw)) == api.ActionCommand(seq, t, frozenset(keys))


@given(st.text(max_size=200))
def test_arbitrary_text_is_accepted_or_rejected_cleanly(raw):
    try:
        m.parse_client_message(raw)
    except m.MessageError as err:
        assert err.field and err.reason


# ---------------------------------------------------------------- HTTP bodies
def test_body_create_session():
    body = m.parse_body(m.CreateSessionRequest, b'{"prompt":"snow","seed":3}')
    assert (body.prompt, body.seed, body.fps) == ("snow", 3, None)
    # no prompt: "" (a world that takes none accepts it; the server checks the world)
    assert m.parse_body(m.CreateSessionRequest, b'{"seed":1}').prompt == ""


@pytest.mark.parametrize("raw, code, field", [
    (b"{", "malformed", "body"),
    (b'{"prompt":"' + b"a" * 401 + b'"}', "string_too_long", "prompt"),
    (b'{"prompt":"a","seed":-2}', "greater_than_equal", "seed"),
    (b'{"prompt":"a","fps":0}', "greater_than_equal", "fps"),
    (b'{"prompt":"a","seed":"3"}', "int_type", "seed"),
    (b'{"prompt":"a"}' + b" " * m.MAX_HTTP_BODY_BYTES, "too_large", "body"),
])
def test_body_rejections(raw, code, field):
    with pytest.raises(m.MessageError) as info:
        m.parse_body(m.CreateSessionRequest, raw)
    assert (info.value.code, info.value.field) == (code, field)


def test_offer_must_be_an_offer():
    with pytest.raises(m.MessageError) as info:
        m.parse_body(m.OfferRequest, b'{"sdp":"v=0","type":"answer"}')
    assert info.value.field == "type"


def test_nesting_is_bounded_before_parsing():
    deep_field = '{"type":"ping","seq":1,"t":0,"x":' + "[" * 20 + "]" * 20 + "}"
    for raw in ("[" * 1100 + "]" * 1100, deep_field):
        err = reject(raw)
        assert err.code == "malformed" and "nested" in err.reason
    assert m.json_depth('{"a": "[[[[\\"{{"}') == 1  # brackets inside strings do not count


def test_out_of_range_numbers_are_refused():
    """Issue 12, item 11: seq 10**100 froze steering; a pointer of [NaN, Infinity] passed."""
    err = reject('{"type":"action","seq":' + "1" + "0" * 100 + ',"t":1,"keys":[]}')
    assert err.field == "seq"
    assert m.parse_client_message(json.dumps(
        {"type": "action", "seq": m.MAX_SEQ, "t": 1, "keys": []})).seq == m.MAX_SEQ
    for bad in ("[NaN, 1]", "[1, Infinity]", "[-Infinity, 0]"):
        err = reject('{"type":"action","seq":1,"t":1,"keys":[],"pointer":' + bad + "}")
        assert err.field.startswith("pointer")
