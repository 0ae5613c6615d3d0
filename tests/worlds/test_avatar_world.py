"""The avatar world (issue 16): viseme tracks, action ids, controls, simulator dynamics and
drawing, the simulator backend and the wire fields, against hand-worked cases."""

from __future__ import annotations

import json

import numpy as np
import pytest

from worldstream.engine.backends.avatar.sim import AvatarSimBackend
from worldstream.engine.core.api import ActionCommand
from worldstream.engine.core.backend import ChunkJob
from worldstream.engine.worlds.actions import IDLE, direction_to_action
from worldstream.engine.worlds.avatar.actions import (
    NUM_ACTIONS,
    AvatarControls,
    decode_action,
    encode_action,
)
from worldstream.engine.worlds.avatar.simulator import (
    FACE_TABLE,
    AvatarSimulator,
)
from worldstream.engine.worlds.avatar.visemes import VISEMES, check_say, text_to_visemes
from worldstream.streaming import messages as m

V = {name: i for i, name in enumerate(VISEMES)}
RIGHT = direction_to_action(1, 0)
SMILE, SURPRISE = 1, 2


# ---------------------------------------------------------------- visemes
def test_hello_world_track_by_hand():
    # h CONS 0.10 s, e E 0.15, ll CONS 0.20, o O 0.15, ", " rest 0.20 + 0.05, w U 0.15,
    # o O 0.15, rld CONS 0.30, "!" rest 0.30, final stop 0.30: at 20 fps
    # 2, 3, 4, 3, 5, 3, 3, 6, 6, 6 frames
    expected = (["CONS"] * 2 + ["E"] * 3 + ["CONS"] * 4 + ["O"] * 3 + ["rest"] * 5
                + ["U"] * 3 + ["O"] * 3 + ["CONS"] * 6 + ["rest"] * 12)
    assert [VISEMES[i] for i in text_to_visemes("Hello, world!")] == expected


def test_rate_and_digraphs_and_accents():
    # "ab" at rate 2: boundaries 0.15, 0.25, 0.55 s * 10 frames/s = 1.5, 2.5, 5.5 -> half up
    # 2, 3, 6: AA 2 frames, MBP 1, stop 3
    assert [VISEMES[i] for i in text_to_visemes("ab", rate=2.0)] == (
        ["AA"] * 2 + ["MBP"] + ["rest"] * 3)
    # "see" = s CONS + ee as one I; "café" speaks like "cafe"
    assert [VISEMES[i] for i in text_to_visemes("see")] == ["CONS"] * 2 + ["I"] * 3 + ["rest"] * 6
    np.testing.assert_array_equal(text_to_visemes("café"), text_to_visemes("cafe"))


@pytest.mark.parametrize("text", ["", "!!! ...", "x" * 201, 5])
def test_unsayable_text_is_refused(text):
    with pytest.raises(ValueError):
        check_say(text)


# ---------------------------------------------------------------- actions and controls
def test_action_ids_factor_and_idle_is_the_landscape_idle():
    assert NUM_ACTIONS == 9 * 5 * 9
    assert encode_action() == IDLE  # the generator prefills start frames with IDLE
    assert encode_action(RIGHT, SMILE, V["AA"]) == RIGHT + 9 * (SMILE + 5 * V["AA"])
    for a in (0, 4, 77, NUM_ACTIONS - 1):
        assert encode_action(*decode_action(a)) == a
    with pytest.raises(ValueError):
        decode_action(NUM_ACTIONS)
    with pytest.raises(ValueError):
        encode_action(IDLE, 5, 0)


def test_controls_consume_speech_one_frame_each_and_keep_the_expression():
    c = AvatarControls()
    c.set_expression("surprise")
    n = c.say("ab", rate=2.0)  # AA AA MBP rest rest rest
    assert n == 6
    acts = c.next_actions([RIGHT, IDLE, IDLE])
    assert [decode_action(a) for a in acts] == [
        (RIGHT, SURPRISE, V["AA"]), (IDLE, SURPRISE, V["AA"]), (IDLE, SURPRISE, V["MBP"])]
    with pytest.raises(ValueError):
        c.next_actions([IDLE, 9])
    assert len(c.speech) == 3  # nothing consumed by the refused call
    with pytest.raises(ValueError):
        c.set_expression("happy")
    assert c.expression == SURPRISE


# ---------------------------------------------------------------- simulator
def test_same_seed_and_actions_give_identical_frames():
    acts = [encode_action(RIGHT, SMILE, V["O"])] * 5 + [IDLE] * 5
    a, b = AvatarSimulator(3, "city"), AvatarSimulator(3, "city")
    for act in acts:
        np.testing.assert_array_equal(a.step(act), b.step(act))


def test_easing_toward_targets_by_hand():
    sim = AvatarSimulator(0, "studio")
    sim.step(encode_action(RIGHT, SMILE, V["AA"]))
    # mouth: 0.7 of the way to AA's openness 1.0 in one frame, 0.91 after two
    assert sim.pose.mouth_open == pytest.approx(0.7)
    np.testing.assert_allclose(sim.pose.face, 0.3 * FACE_TABLE[SMILE] + 0.7 * FACE_TABLE[0],
                               atol=1e-6)
    for _ in range(11):
        sim.step(encode_action(RIGHT, SMILE, V["AA"]))
    assert sim.pose.mouth_open == pytest.approx(1 - 0.3**12)
    # head: 1 - 0.75^12 = 0.968 of the way to yaw 1, give or take the 0.04 sway
    assert abs(sim.pose.yaw - (1 - 0.75**12)) < 0.05
    for _ in range(20):
        sim.step(IDLE)
    assert abs(sim.pose.yaw) < 0.06 and sim.pose.mouth_open < 1e-6


def _dark_mouth_pixels(frame: np.ndarray) -> int:
    """Pixels of the mouth's dark inside colour (60, 15, 20) near the face's lower half."""
    region = frame[60:85, 40:90].astype(int)
    return int((np.abs(region - (60, 15, 20)).sum(-1) < 30).sum())


def test_open_mouth_and_turned_head_show_in_the_picture():
    sim = AvatarSimulator(5, "office")
    closed = sim.step(IDLE)
    assert _dark_mouth_pixels(closed) == 0
    for _ in range(3):
        opened = sim.step(encode_action(IDLE, 0, V["AA"]))
    assert _dark_mouth_pixels(opened) > 20
    # turning right moves the head 7·yaw px right (its skin centroid at least half of that)
    skin = np.asarray(sim.appearance.skin)

    def skin_x(frame):
        mask = np.abs(frame[30:75].astype(float) - skin).sum(-1) < 12
        return np.nonzero(mask)[1].mean()

    centre = skin_x(sim.render())
    for _ in range(15):
        turned = sim.step(encode_action(RIGHT))
    assert skin_x(turned) > centre + 3.5


def test_blinks_close_the_eyelids_over_four_frames():
    sim = AvatarSimulator(8, "space")
    closures = [sim.pose.blink for _ in range(200) if sim.step(IDLE) is not None]
    runs = "".join("x" if c > 0 else "." for c in closures)
    assert "xxxx" in runs and "xxxxx" not in runs
    assert max(closures) == 1.0


# ---------------------------------------------------------------- backend and wire
def test_sim_backend_steers_with_controls_and_rewinds_them():
    backend = AvatarSimBackend(chunk_frames=2, look_for=lambda p: "beach")
    state = backend.new_state("a beach", 4)
    backend.apply_controls(state, expression="smile", say="ab")
    frames = backend.generate([ChunkJob(state, [RIGHT, RIGHT], 2)])[0].frames
    ref = AvatarSimulator(4, "beach")
    for frame, viseme in zip(frames, ("AA", "AA")):
        np.testing.assert_array_equal(frame, ref.step(encode_action(RIGHT, SMILE, V[viseme])))
    queued = len(state.controls.speech)
    backend.generate([ChunkJob(state, [IDLE, IDLE], 2)])
    backend.rewind(state, 1)
    assert len(state.controls.speech) == queued
    # both fields checked before either applies
    with pytest.raises(ValueError):
        backend.apply_controls(state, expression="happy", say="hello")
    assert len(state.controls.speech) == queued and state.controls.expression == SMILE


def test_action_message_carries_expression_and_say():
    msg = m.parse_client_message(json.dumps(
        {"type": "action", "seq": 1, "t": 0, "keys": ["left"], "expression": "frown",
         "say": "hi"}))
    assert m.to_command(msg) == ActionCommand(1, 0.0, frozenset({"left"}), expression="frown",
                                                  say="hi")


@pytest.mark.parametrize("extra, code, field", [
    ({"expression": "happy"}, "literal_error", "expression"),
    ({"say": ""}, "string_too_short", "say"),
    ({"say": "a" * 201}, "string_too_long", "say"),
    ({"say": 3}, "string_type", "say"),
])
def test_bad_avatar_fields_are_rejected_by_name(extra, code, field):
    raw = json.dumps({"type": "action", "seq": 1, "t": 0, "keys": [], **extra})
    with pytest.raises(m.MessageError) as info:
        m.parse_client_message(raw)
    assert (info.value.code, info.value.field) == (code, field)
