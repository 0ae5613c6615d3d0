"""A chunk's path is one ordered list of named stages: the runner walks the family's list in
order, reports each stage's time under its key, and leaves the after-delivery stages to
``finish``; a stage can be swapped for another by name."""

import numpy as np
import pytest

from worldstream.engine.backends.builtin import AFTER_DELIVERY, STAGES
from worldstream.engine.backends.stages import ChunkBatch, Stage, replace_stage
from worldstream.engine.backends.wan.backend import WanBackend
from worldstream.engine.core.backend import ChunkJob
from worldstream.engine.worlds.actions import IDLE


def test_the_families_list_their_stages_in_one_order():
    assert [s.name for s in STAGES] == ["plan", "select_pages", "condition", "noise",
                                         "denoise", "show"]
    assert [s.name for s in AFTER_DELIVERY] == ["cache_fill", "commit", "remember"]
    assert [s.name for s in WanBackend.stages] == [s.name for s in STAGES]


def test_replace_stage_swaps_one_stage_by_name():
    def run(backend, batch):
        return None

    swapped = replace_stage(STAGES, "noise", run)
    assert [s.run for s in swapped] == [run if s.name == "noise" else s.run for s in STAGES]
    assert swapped[3].reported_as == STAGES[3].reported_as
    with pytest.raises(KeyError, match="no stage 'decode'"):
        replace_stage(STAGES, "decode", run)


def test_the_runner_walks_the_stages_in_order_and_defers_the_rest():
    """Every stage spied: the batch's chunk runs plan .. show in order, the cache fill,
    commit and memory write only at ``finish``; each reported key sums its stages' times."""
    from tests.fixtures.builtin import tiny_generator

    gen = tiny_generator()
    state = gen.new_state("a green meadow", seed=3)
    gen.finish()
    order = []

    def spied(stage: Stage) -> Stage:
        def run(backend, batch: ChunkBatch, inner=stage.run):
            order.append(stage.name)
            inner(backend, batch)
        return Stage(stage.name, run, stage.reported_as)

    gen.stages = tuple(spied(s) for s in gen.stages)
    gen.after_delivery = tuple(spied(s) for s in gen.after_delivery)
    (res,) = gen.generate([ChunkJob(state, [IDLE] * gen.chunk_frames, steps=2)])
    assert order == ["plan", "select_pages", "condition", "noise", "denoise", "show"]
    assert set(res.stages_ms) == {"memory_read", "denoise", "decode"}
    assert all(ms >= 0 for ms in res.stages_ms.values())
    assert len(state.history) == 1  # the start chunk only: the new one is not committed yet
    gen.finish()
    assert order[6:] == ["cache_fill", "commit", "remember"]
    assert len(state.history) == 2
    np.testing.assert_array_equal(state.history[-1].actions, [IDLE] * gen.chunk_frames)
