"""Matrix-Game 2.0's action inputs, hand-worked for each variant: the keys and mouse of the
engine's per-frame controls become the model's keyboard and (pitch, yaw) inputs, and each
latent frame of a chunk reads the 12 raw frames before its last one, left-padded with the
stream's raw frame 0 (a first chunk is 9 raw frames: its first shown frames repeat frame 0)."""

from __future__ import annotations

import pytest
import torch

from tests.fixtures.matrix_game import tiny_parts
from worldstream.engine.backends.matrix_game.backend import (
    MatrixGameBackend,
    MatrixGameBackendConfig,
)
from worldstream.engine.backends.matrix_game.stages import plan
from worldstream.engine.backends.stages import ChunkBatch
from worldstream.engine.core.backend import ChunkJob
from worldstream.engine.models.matrix_game.conditions import action_windows, raw_inputs
from worldstream.engine.models.matrix_game.config import get_variant


def frames(variant: str, held: list[set[str]], pointer=(0.0, 0.0)) -> torch.Tensor:
    """Controls of frames holding ``held[i]``, each with ``pointer`` motion (model units)."""
    v = get_variant(variant)
    rows = [[1.0 if k in keys else 0.0 for k in v.keys] + (list(pointer) if v.pointer else [])
            for keys in held]
    return torch.tensor(rows)


def test_keys_and_mouse_become_each_variants_inputs():
    kb, mouse = raw_inputs(get_variant("universal"), frames(
        "universal", [{"forward", "look_up"}, {"right", "look_left"}], (0.03, -0.02)))
    assert kb.tolist() == [[1, 0, 0, 0], [0, 0, 0, 1]]
    # (pitch, yaw): the look keys at 0.1 a frame plus the pointer's (x -> yaw, y -> pitch)
    assert torch.allclose(mouse, torch.tensor([[0.1 - 0.02, 0.03], [-0.02, 0.03 - 0.1]]))
    kb, mouse = raw_inputs(get_variant("gta_drive"), frames(
        "gta_drive", [{"forward", "right"}, {"back", "left"}, set()]))
    assert kb.tolist() == [[1, 0], [0, 1], [0, 0]]  # W/S drive
    assert torch.allclose(mouse, torch.tensor([[0, 0.1], [0, -0.1], [0, 0]]))  # A/D steer
    kb, mouse = raw_inputs(get_variant("templerun"), frames(
        "templerun", [set(), {"jump"}, {"slide"}, {"turn_left"}, {"turn_right"}, {"left"},
                      {"right"}]))
    assert mouse is None and kb.tolist() == torch.eye(7).tolist()  # index 0: no action
    with pytest.raises(ValueError, match="takes 10 controls"):
        raw_inputs(get_variant("universal"), torch.zeros(2, 8))


def test_windows_and_left_padding_by_hand():
    raw = torch.arange(1.0, 10.0)[None, :, None]  # raw frames 0..8 valued 1..9
    windows, tail = action_windows(None, raw, 3)
    got = windows[0, :, :, 0].tolist()
    assert got[0] == [1.0] * 12  # latent 0: raw frame 0 alone, padded
    assert got[1] == [1.0] * 8 + [1, 2, 3, 4]  # raw -8..3: eight pads, then raw 0..3
    assert got[2] == [1.0] * 4 + [1, 2, 3, 4, 5, 6, 7, 8]  # raw -4..7
    assert tail[0, :, 0].tolist() == [1.0] * 3 + list(range(1, 10))  # raw -3..8
    windows, tail = action_windows(tail, torch.arange(10.0, 22.0)[None, :, None], 3)
    got = windows[0, :, :, 0].tolist()
    assert got[0] == list(range(1, 13))  # latent 3: raw 0..11
    assert got[1] == list(range(5, 17))  # latent 4: raw 4..15
    assert got[2] == list(range(9, 21))  # latent 5: raw 8..19
    assert tail[0, :, 0].tolist() == list(range(10, 22))


def _plan(backend, state, controls):
    batch = ChunkBatch([ChunkJob(state, [0] * 12, 1, 0, controls.tolist())], [[0, 1, 2]])
    plan(backend, batch)
    return batch.records[0]


@pytest.mark.parametrize("variant, key, column", [
    ("universal", "forward", 0), ("gta_drive", "back", 1), ("templerun", "slide", 2)])
def test_each_variants_chunks_read_the_hand_worked_windows(variant, key, column):
    model, cfg, vae, encoder = tiny_parts(variant)
    backend = MatrixGameBackend(model, cfg, vae, encoder, MatrixGameBackendConfig(
        variant=variant, height=32, width=32, device="cpu", cond_frames=2))
    state = backend.new_state("play", seed=0)
    # a first chunk: shown frames 0-2 repeat raw frame 0; `key` held from raw frame 4 on,
    # and raw frame 0 steers (a look / steering key, or Temple Run's left side)
    steer = {"universal": "look_up", "gta_drive": "left", "templerun": "left"}[variant]
    held = [{steer}] * 4 + [set()] * 3 + [{key}] * 5
    record = _plan(backend, state, frames(variant, held))
    hot = record.keyboard[:, :, column].tolist()
    assert hot == [[0.0] * 12, [0.0] * 12, [0.0] * 8 + [1.0] * 4]
    if variant == "templerun":  # no mouse: "left side" is key 5, held on raw frame 0 only
        assert record.mouse is None
        assert record.keyboard[:, :, 5].tolist() == [[1.0] * 12, [1.0] * 9 + [0.0] * 3,
                                                     [1.0] * 5 + [0.0] * 7]
    else:  # (pitch, yaw) per raw frame: raw frame 0's steering pads each window's left
        axis = 0 if variant == "universal" else 1
        sign = 1.0 if variant == "universal" else -1.0
        steered = (record.mouse.view(3, 12, 2)[:, :, axis] * sign / 0.1).round().tolist()
        assert steered == [[1.0] * 12, [1.0] * 9 + [0.0] * 3, [1.0] * 5 + [0.0] * 7]
    # the next chunk continues from this one's raw frames (no padding): latent 3 reads raw
    # 0..11 = [steer, 0, 0, 0, key x 5, next chunk's first 3]
    record.latents = torch.zeros(backend.latent_shape)
    state.history.append(record)
    nxt = _plan(backend, state, frames(variant, [set()] * 12))
    assert nxt.keyboard[0, :, column].tolist() == [0.0] * 4 + [1.0] * 5 + [0.0] * 3
