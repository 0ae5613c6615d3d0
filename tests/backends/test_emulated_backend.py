"""The emulated accelerator (issue 55): the simulator's frames at the emulated size, each batch
lasting the cost model's time, spent waiting rather than computing."""

from __future__ import annotations

import time

import numpy as np
import pytest

from worldstream.engine.backends.emulated import EmulatedBackend, EmulatedCost, upscaler
from worldstream.engine.backends.sim.backend import SimBackend
from worldstream.engine.core.backend import ChunkJob
from worldstream.engine.core.registry import load_backend
from worldstream.engine.worlds.actions import keys_to_action

UP = keys_to_action({"up"})


def _meadow(_prompt: str) -> str:
    return "meadow"


def test_cost_model_is_calibrated_on_self_forcing_and_linear_in_rows_frames_and_area():
    cost = EmulatedCost()
    # Self-Forcing, one H100: 17.0 FPS at 832x480 in 12-frame chunks -> 706 ms a chunk
    assert cost.chunk_ms([12], 832, 480) == pytest.approx(12 / 17.0 * 1e3, rel=0.01)
    one, four = cost.chunk_ms([2], 128, 128), cost.chunk_ms([2, 2, 2, 2], 128, 128)
    assert four - cost.a_ms == pytest.approx(4 * (one - cost.a_ms))  # b per row
    quarter = cost.chunk_ms([1], 416, 240) - cost.a_ms  # a quarter of the area
    assert quarter == pytest.approx((cost.chunk_ms([1], 832, 480) - cost.a_ms) / 4)
    assert cost.chunk_ms([], 832, 480) == 0.0
    with pytest.raises(ValueError, match="a_ms"):
        EmulatedCost(a_ms=-1)


def test_sessions_per_replica_follow_the_batching_curve():
    cost = EmulatedCost(a_ms=20, b_ms=57.2)
    # 832x480 at 16 fps in 12-frame chunks: one session fits a 750 ms chunk, two do not
    assert cost.sessions_per_replica(16, 12, 832, 480) == 1
    n = cost.sessions_per_replica(16, 1, 128, 128)
    assert cost.chunk_ms([1] * n, 128, 128) <= 1e3 / 16 < cost.chunk_ms([1] * (n + 1), 128, 128)
    assert n >= 4  # the bench's 4 sessions per replica fit


def test_generate_waits_the_modelled_time_less_the_simulators_own():
    waits: list[float] = []
    backend = EmulatedBackend(width=832, height=480, sleep=waits.append, scene_for=_meadow)
    a, b = backend.new_state("x", 1), backend.new_state("y", 2)
    t0 = time.perf_counter()
    results = backend.generate([ChunkJob(a, [UP, UP], 4), ChunkJob(b, [UP], 4)])
    elapsed_ms = (time.perf_counter() - t0) * 1e3
    modelled = backend.cost.chunk_ms([2, 1], 832, 480)
    assert len(waits) == 1 and waits[0] * 1e3 == pytest.approx(
        results[0].stages_ms["emulated_wait"])
    # the wait plus the real work is the modelled time (the work ran before the wait; the
    # sleep is a stub, so all the time elapsed is work); on a busy machine the work alone can
    # outlast the modelled time, and then nothing is waited
    assert waits[0] * 1e3 == pytest.approx(max(modelled - elapsed_ms, 0.0),
                                           abs=elapsed_ms * 0.2 + 1)
    assert results[0].frames.shape == (2, 480, 832, 3) and results[1].frames.shape == (
        1, 480, 832, 3)


def test_frames_are_the_simulators_upscaled():
    sim = SimBackend(scene_for=_meadow)
    emu = EmulatedBackend(width=832, height=480, sleep=lambda s: None, scene_for=_meadow)
    (ref,) = sim.generate([ChunkJob(sim.new_state("x", 5), [UP], 2)])
    (got,) = emu.generate([ChunkJob(emu.new_state("x", 5), [UP], 2)])
    # nearest neighbour: output pixel ceil(k * size / 128) shows source pixel k
    rows, cols = (np.arange(128) * 480 + 127) // 128, (np.arange(128) * 832 + 127) // 128
    small = got.frames[0][rows][:, cols]
    np.testing.assert_array_equal(small, ref.frames[0])
    assert upscaler(128, 128, 128)(ref.frames) is ref.frames  # no copy at the own size


def test_a_chunk_costs_wall_time_not_cpu_time():
    backend = EmulatedBackend(cost=EmulatedCost(a_ms=300, b_ms=0), scene_for=_meadow)
    state = backend.new_state("x", 3)
    wall0, cpu0 = time.perf_counter(), time.process_time()
    backend.generate([ChunkJob(state, [UP], 2)])
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    assert wall >= 0.3 and cpu < 0.1


def test_registry_builds_it_by_name_with_a_frame_size():
    backend = load_backend("emulated", frame_size="832x480", a_ms=5.0, scene_for=_meadow)
    assert (backend.name, backend.width, backend.height) == ("emulated", 832, 480)
    assert backend.cost.a_ms == 5.0
    with pytest.raises(ValueError, match="frame_size"):
        load_backend("emulated", frame_size="64x64", scene_for=_meadow)
    with pytest.raises(ValueError, match="width and height"):
        EmulatedBackend(width=8, height=8, scene_for=_meadow)


def test_scenes_come_from_keywords_without_a_text_model():
    from worldstream.engine.backends.emulated import keyword_scene

    assert [keyword_scene(p) for p in ("Hot DESERT dunes", "a snowy night", "anything")] == [
        "desert", "snow", "meadow"]
    assert EmulatedBackend().new_state("a snow field", 1).scene == "snow"
