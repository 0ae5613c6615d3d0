"""Save points of Matrix-Game 2.0 on the tiny configuration (CPU, fp32): a state saved after
two chunks and loaded into a new one continues with the same keys and mouse motion to the
same frames, bit for bit, rewinds included; the load takes pages from the pool and gives them
all back when it fails; the model version names the variant, weights and settings."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.fixtures.matrix_game import tiny_parts
from worldstream.engine.backends.matrix_game import savestate as savestate_matrix_game
from worldstream.engine.backends.matrix_game.backend import (
    MatrixGameBackend,
    MatrixGameBackendConfig,
)
from worldstream.engine.core.api import CapacityError
from worldstream.engine.core.backend import ChunkJob
from worldstream.engine.studio.savepoint import (
    SAVEPOINT_FORMAT,
    SavepointError,
    decode,
    encode,
    model_version,
)
from worldstream.engine.studio.savestate import export_state, import_state


def make(variant: str = "universal", seed: int = 0, **settings) -> MatrixGameBackend:
    model, cfg, vae, encoder = tiny_parts(variant, seed)
    settings = {"max_states": 2, **settings}
    return MatrixGameBackend(model, cfg, vae, encoder, MatrixGameBackendConfig(
        variant=variant, height=32, width=32, device="cpu", cond_frames=4, memory_chunks=4,
        **settings))


def controls(backend, g: torch.Generator) -> list:
    """12 frames of random held keys and pointer motion (model units)."""
    n = len(backend.variant.keys)
    keys = (torch.rand(12, n, generator=g) < 0.4).float()
    pointer = (torch.rand(12, backend.action_space.size - n, generator=g) - 0.5) * 0.4
    return torch.cat([keys, pointer], 1).tolist()


def chunk(backend, state, c) -> np.ndarray:
    # seed None: the noise comes from the state's own generator, which the file carries
    (result,) = backend.generate([ChunkJob(state, [0] * 12, 1, None, c)])
    assert result.error is None, result.error
    backend.finish()
    return result.frames


def saved(backend, state) -> bytes:
    arrays, scalars = export_state(backend, state)
    meta = {"format": SAVEPOINT_FORMAT, "model": backend.name,
            "model_version": model_version(backend),
            "session": {"seed": 1, "prompt": "play", "action": 0, "frame_index": 36,
                        "chunk_frames": 12, "steps": 1, "mode": None, "fork_id": -1},
            "state": scalars}
    return encode(arrays, meta)


def loaded(backend, data: bytes):
    arrays, meta = decode(data, backend)
    return import_state(backend, arrays, meta["state"])


@pytest.fixture(scope="module")
def backend():
    return make()


def test_a_loaded_state_continues_bit_identically(backend):
    g = torch.Generator().manual_seed(3)
    state = backend.new_state("play", seed=1)
    for _ in range(2):
        chunk(backend, state, controls(backend, g))
    data = saved(backend, state)
    twin = loaded(backend, data)
    assert set(twin.table.all_pages()).isdisjoint(state.table.all_pages())
    plan = [controls(backend, g) for _ in range(2)]
    original = [chunk(backend, state, c) for c in plan]
    restored = [chunk(backend, twin, c) for c in plan]
    assert all(np.array_equal(a, b) for a, b in zip(original, restored))
    backend.rewind(state, 3)
    backend.rewind(twin, 3)
    # a rewind reaches back into the older pages and re-decodes the retained chunks
    assert np.array_equal(chunk(backend, state, plan[0]), chunk(backend, twin, plan[0]))
    # the mouse moved the camera: the same keys with other motion, other frames
    backend.rewind(state, 1)
    backend.rewind(twin, 1)
    turned = [[*row[:-1], row[-1] + 0.2] for row in plan[0]]
    assert not np.array_equal(chunk(backend, state, turned), chunk(backend, twin, plan[0]))
    backend.free(state)
    backend.free(twin)
    assert backend.allocator.num_free() == backend.allocator.num_pages


def test_a_failed_load_gives_back_every_page_it_took(backend):
    state = backend.new_state("play", seed=2)
    g = torch.Generator().manual_seed(4)
    for _ in range(2):
        chunk(backend, state, controls(backend, g))
    arrays, scalars = export_state(backend, state)
    free = backend.allocator.num_free()
    broken = dict(arrays, cond=arrays["cond"][:, :1])  # pages written, then the picture fails
    with pytest.raises(SavepointError, match="picture conditioning"):
        import_state(backend, broken, scalars)
    assert backend.allocator.num_free() == free
    entry = next(k for k in arrays if k.startswith("dec."))  # the decoder cache, last read
    with pytest.raises(SavepointError, match=f"{entry} is int64"):
        import_state(backend, dict(arrays, **{entry: arrays[entry].astype(np.int64)}), scalars)
    assert backend.allocator.num_free() == free
    hold = backend.allocator.allocate(free - 1)  # the pool nearly full: the load counts
    with pytest.raises(CapacityError):
        import_state(backend, arrays, scalars)
    backend.allocator.decref(hold)
    assert backend.allocator.num_free() == free
    with pytest.raises(SavepointError, match="pages kv.k do not fit"):
        import_state(backend, dict(arrays, **{"kv.k": arrays["kv.k"][:, :1]}), scalars)
    backend.free(state)


def test_a_state_over_the_file_limit_is_refused_before_copying(backend, monkeypatch):
    state = backend.new_state("play", seed=2)
    chunk(backend, state, controls(backend, torch.Generator().manual_seed(5)))
    monkeypatch.setattr(savestate_matrix_game, "MAX_SAVEPOINT_BYTES", 2**10)
    with pytest.raises(SavepointError, match="frames of keys and values"):
        export_state(backend, state)
    backend.free(state)


def test_the_model_version_names_variant_weights_and_settings(backend):
    assert model_version(backend) == model_version(make())
    assert model_version(backend) != model_version(make(seed=1))
    assert model_version(backend) != model_version(make(mouse_sensitivity=0.02))
    assert model_version(backend) == model_version(make(max_states=3))  # room, not frames
    gta = make("gta_drive")
    state = gta.new_state("play", seed=0)
    data = saved(gta, state)
    gta.free(state)
    with pytest.raises(SavepointError, match="of model 'matrix-game-2:gta_drive'; this server "
                                             "runs 'matrix-game-2:universal'"):
        decode(data, backend)


def test_bfloat16_tensors_travel_as_their_bits():
    """On CUDA the pools, the image tokens and the decoder cache are bfloat16 (numpy has none)."""
    x = torch.randn(3, 5, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    stored = savestate_matrix_game._to_array(x)
    assert stored.dtype == np.int16
    back = savestate_matrix_game._to_tensor(stored, torch.bfloat16, torch.device("cpu"), "x")
    assert back.dtype == torch.bfloat16 and torch.equal(back.view(torch.int16),
                                                        x.view(torch.int16))
    with pytest.raises(SavepointError, match="x is int16; this model keeps torch.float32"):
        savestate_matrix_game._to_tensor(stored, torch.float32, torch.device("cpu"), "x")
