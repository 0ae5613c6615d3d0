"""The side-by-side sheet and the action-script unrolling behind it."""

import json

import numpy as np
from PIL import Image

from tests.fixtures.builtin import tiny_generator
from worldstream.app.action_script import load_action_script
from worldstream.engine.evaluation.metrics import anisotropy
from worldstream.engine.evaluation.sheet import frame_label, save_sheet, side_by_side
from worldstream.engine.worlds.actions import IDLE, keys_to_action
from worldstream.engine.worlds.scenes import palette
from worldstream.engine.worlds.simulator import player_mask


def test_action_script_unrolls_to_per_frame_actions_and_prompts(tmp_path):
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"events": [
        {"frame": 0, "keys": []},
        {"frame": 2, "keys": ["right"]},
        {"frame": 4, "prompt": "a snowy forest"},
        {"frame": 5, "keys": ["down", "right"]},
    ]}))
    actions, prompts = load_action_script(path).per_frame(7)
    right, down_right = keys_to_action(["right"]), keys_to_action(["down", "right"])
    assert actions == [IDLE, IDLE, right, right, right, down_right, down_right]
    assert prompts == {4: "a snowy forest"}


def test_sheet_pairs_model_and_simulator_frames(tmp_path):
    gen = tiny_generator()
    actions = [keys_to_action(["right"])] * 12
    model, sim = side_by_side(gen, actions, "a snowy forest", {6: "hot desert dunes"}, steps=1)
    assert model.shape == sim.shape == (12, 128, 128, 3)
    assert np.array_equal(model[:2], sim[:2])  # both start from the simulator's first chunk
    assert not np.array_equal(sim[0], sim[-1])  # the simulator moved right
    out = save_sheet(model, sim, tmp_path / "sheet.png", "test", moments=(0, 5, 10, 40))
    img = np.asarray(Image.open(out))
    assert img.shape[0] > 200 and img.shape[1] > 3 * 128  # two rows, three moments (40 > 12)
    labelled = save_sheet(model, sim, tmp_path / "frag.png", "test", moments=(0, 5, 10),
                          classes=palette("snow"))
    assert np.asarray(Image.open(labelled)).shape == img.shape


def test_frame_label_hand_worked():
    """The simulator against itself reads 1.00 twice; a frame whose right half is recoloured
    to another class gains the boundary it draws: the ratio is hand-counted."""
    frame = np.zeros((128, 128, 3), np.uint8)
    frame[...] = palette("snow")[3]  # snow ground everywhere
    frame[:, 64:] = palette("snow")[6]  # rock on the right: one boundary per row
    assert frame_label(frame, frame) == f"sharp 1.00\naniso {anisotropy(frame):.2f}"
    assert frame_label(frame, frame, palette("snow")).endswith("\nfrag 1.00")
    split = frame.copy()
    split[:32] = palette("snow")[0]  # deep water over the top quarter: a second boundary
    # across: rows 0-31 are water on both sides of column 64 (no change), rows 32-127 change
    # once; down: columns change once each between rows 31 and 32 (sprite rows excluded)
    keep = ~player_mask(128)
    across = keep[:, 1:] & keep[:, :-1]
    down = keep[1:] & keep[:-1]
    pairs = across.sum() + down.sum()
    before = np.sum(across[:, 63])
    after = np.sum(across[32:, 63]) + np.sum(down[31])
    assert frame_label(split, frame, palette("snow")).endswith(
        f"\nfrag {(after / pairs) / (before / pairs):.2f}")
