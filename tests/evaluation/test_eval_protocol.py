"""The evaluation protocol runs end to end on a tiny random model and scores the ground truth
perfectly where it must."""

import numpy as np
import pytest

from tests.fixtures.builtin import tiny_generator
from worldstream.engine.core.backend import ChunkResult
from worldstream.engine.evaluation.drift import drift_metrics, long_rollouts
from worldstream.engine.evaluation.episodes import record, rollout, teacher_forced
from worldstream.engine.evaluation.metrics import psnr
from worldstream.engine.evaluation.run import action_hits, revisit
from worldstream.engine.worlds.simulator import WorldSimulator


@pytest.mark.slow
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
    assert set(d["luma_drift"]) == set(d["luma_drift_ground_truth"]) == {"desert_idle",
                                                                          "desert_moving"}
    assert np.isfinite(d["rollout_sharpness_ratio"]) and 0 <= d["rollout_anisotropy"] <= 1
    # the simulator's own frames are on the palette; a random model's colours are not
    assert d["rollout_off_palette_ground_truth"] == 0.0
    assert 0.1 < d["rollout_off_palette"] <= 1 and 0 < d["rollout_off_palette_mean"]
    assert 0 <= d["rollout_off_palette_autoencoder"] <= 1
    # another world of the scene strays within a factor 2 of this one's class boundaries;
    # the tiny model's frames and its untrained autoencoder's are read (the values are
    # hand-worked in test_eval_metrics)
    assert 0.5 < d["rollout_fragmentation_ground_truth"] < 2
    assert d["rollout_fragmentation_autoencoder"] >= 0
    assert d["rollout_fragmentation"] > 0 and d["rollout_fragmentation_mean"] > 0
    r = revisit(gen, steps=1, episodes=1)
    assert np.isfinite(r["revisit_psnr_db"]) and r["revisit_psnr_db_ground_truth"] > 15
    r = revisit(gen, steps=1, episodes=1, travel=True)
    assert (np.isfinite(r["revisit_generated_psnr_db"])
            and r["revisit_generated_psnr_db_ground_truth"] > 15)
    assert gen.allocator.num_free() == gen.allocator.num_pages  # every state freed


class _OracleBackend:
    """A backend that "generates" what the simulator shows for the chunk's actions: the
    world of ``seed``/``scene``, started by stepping the given start chunk's actions
    (``frozen``: it repeats the start chunk's last frame instead, a model that ignores keys)."""

    def __init__(self, seed, scene, start_actions, frozen=False):
        self.chunk_frames = len(start_actions)
        self.seed, self.scene, self.start_actions, self.frozen = seed, scene, start_actions, frozen

    def new_state(self, prompt, seed, start_frames):
        sim = WorldSimulator(self.seed, self.scene)
        last = [sim.step(a) for a in self.start_actions][-1]
        return {"sim": sim, "last": last}

    def generate(self, jobs):
        (job,) = jobs
        state = job.state
        if self.frozen:
            frames = np.stack([state["last"]] * len(job.actions))
        else:
            frames = np.stack([state["sim"].step(a) for a in job.actions])
        return [ChunkResult(frames)]

    def free(self, state):
        pass


def test_rollout_scores_an_oracle_perfectly_and_a_frozen_model_poorly():
    """``rollout`` and ``action_hits`` against their ground truth: a backend that returns the
    simulator's frames reproduces the episode exactly (PSNR inf on every frame) and moves with
    the camera; one that ignores the keys is caught by the action metric."""
    ep = record(900_502, 24)
    f = 2
    oracle = _OracleBackend(900_502, ep.scene, ep.actions[:f])
    frames = rollout(oracle, ep, steps=1, seed=0)
    assert frames.shape == ep.frames.shape
    assert all(psnr(a, b) == float("inf") for a, b in zip(frames, ep.frames))
    moving = [i for i, hit in enumerate(action_hits(ep.frames, ep.offsets, f))
              if (ep.offsets[(i + 2) * f - 1] != ep.offsets[(i + 1) * f - 1]).any()]
    assert moving, "the episode must move the camera"
    hits = action_hits(frames, ep.offsets, f)
    assert np.mean([hits[i] for i in moving]) >= 0.75
    frozen = rollout(_OracleBackend(900_502, ep.scene, ep.actions[:f], frozen=True), ep,
                     steps=1, seed=0)
    frozen_hits = action_hits(frozen, ep.offsets, f)
    assert np.mean([frozen_hits[i] for i in moving]) <= 0.25
