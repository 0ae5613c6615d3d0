"""The evaluation protocol runs end to end on a tiny random model and scores the ground truth
perfectly where it must."""

import numpy as np

from tests.test_generator import tiny_generator
from worldstream.engine.evaluation.metrics import psnr
from worldstream.engine.evaluation.run import (
    action_hits,
    drift_metrics,
    long_rollouts,
    record,
    revisit,
    rollout,
    teacher_forced,
)


def test_protocol_pieces_run_on_a_tiny_model():
    gen = tiny_generator()
    ep = record(900_500, 8)
    tf = teacher_forced(gen, ep, steps=1, seed=0)
    assert len(tf) == 6 and all(np.isfinite(tf))
    frames = rollout(gen, ep, steps=1, seed=0)
    assert frames.shape == ep.frames.shape
    assert np.array_equal(frames[:2], ep.frames[:2])  # the true first chunk starts the rollout
    assert len(action_hits(frames, ep.offsets, 2)) == 3
    d = drift_metrics(long_rollouts(gen, steps=1, length=160, scenes=["desert"]))
    assert set(d["drift_ratio_160"]) == {"vs_sim", "self", "self_ground_truth"}
    assert set(d["luma_drift"]) == {"desert_idle", "desert_moving"}
    assert np.isfinite(d["rollout_sharpness_ratio"]) and 0 <= d["rollout_anisotropy"] <= 1
    r = revisit(gen, steps=1, episodes=1)
    assert np.isfinite(r["revisit_psnr_db"]) and r["revisit_psnr_db_ground_truth"] > 15
    assert gen.allocator.num_free() == gen.allocator.num_pages  # every state freed


def test_rollout_of_the_truth_is_perfect():
    ep = record(900_502, 10)
    assert all(psnr(a, b) == float("inf") for a, b in zip(ep.frames, ep.frames))
    assert np.mean(action_hits(ep.frames, ep.offsets, 2)) >= 0.75
