"""The avatar's long-rollout metrics: random puppeteering of thousands of frames, model and
simulator on the same actions, kept as per-frame appearance features (sharpness, luma, region
colours) and reduced to identity and drift ratios."""

from __future__ import annotations

import numpy as np

from worldstream.engine.backends.builtin import BuiltinBackend
from worldstream.engine.evaluation.episodes import Episode, streamed_rollout
from worldstream.engine.evaluation.metrics import sharpness
from worldstream.engine.worlds.avatar.looks import LOOKS
from worldstream.engine.worlds.avatar.recorder import PuppeteerPolicy
from worldstream.engine.worlds.avatar.simulator import SIZE, AvatarSimulator

EARLY, LATE = slice(50, 150), slice(1400, 1500)

REGIONS = {  # appearance features: mean colour of each (rows, cols)
    "background_top": (slice(0, 8), slice(0, SIZE)),
    "background_left": (slice(0, 90), slice(0, 8)),
    "background_right": (slice(0, 90), slice(SIZE - 8, SIZE)),
    "head_top": (slice(14, 26), slice(50, 78)),
    "shirt": (slice(116, SIZE), slice(20, SIZE - 20)),
}


def frame_features(rgb: np.ndarray) -> np.ndarray:
    """``(2 + 3 * len(REGIONS),)`` float64: sharpness, luma, then each region's mean RGB."""
    regions = [rgb[r, c].reshape(-1, 3).mean(0) for r, c in REGIONS.values()]
    luma = float(rgb.reshape(-1, 3).mean(0) @ np.array([0.299, 0.587, 0.114]))
    return np.concatenate([[sharpness(rgb), luma], *regions])


def long_rollout(gen: BuiltinBackend, seed: int, look: str, length: int,
                 steps: int) -> dict[str, np.ndarray]:
    """Random puppeteering of ``length`` frames, model and simulator on the same actions:
    per-frame :func:`frame_features` of both, ``(L, F)`` each (frames are not kept)."""
    rng = np.random.default_rng([seed, 9])
    policy = PuppeteerPolicy(rng)
    sim = AvatarSimulator(seed, look)
    f = gen.chunk_frames
    actions, sim_feats, first = [], [], []
    for i in range(length):
        a = policy()
        frame = sim.step(a)
        actions.append(a)
        sim_feats.append(frame_features(frame))
        if i < f:
            first.append(frame)
    model_feats = np.zeros((length, len(sim_feats[0])))
    model_feats[:f] = sim_feats[:f]
    prompt = LOOKS[look]["prompts"][0]
    ep = Episode(np.stack(first), actions, np.zeros((length, 2), np.int64), look, prompt)

    def keep(i, frame):
        model_feats[i] = frame_features(frame)

    streamed_rollout(gen, ep, steps, seed, keep)
    return {"model": model_feats, "sim": np.stack(sim_feats)}


def identity_ratio(feats: np.ndarray) -> float:
    """Of the appearance features (the region colours), late/early ratio farthest from 1."""
    ratios = feats[LATE, 2:].mean(0) / np.maximum(feats[EARLY, 2:].mean(0), 1.0)
    return float(ratios[np.argmax(np.abs(np.log(ratios)))])


def drift_metrics(runs: list[dict], length: int) -> dict:
    """``identity_drift_ratio`` (+ twin) and ``drift_ratio_{length}`` from long rollouts."""
    last = slice(length - 100, length)

    def worst(values):
        return round(float(values[int(np.argmax(np.abs(np.log(values))))]), 3)

    out = {"identity_drift_ratio": worst([identity_ratio(r["model"]) for r in runs]),
           "identity_drift_ratio_ground_truth": worst([identity_ratio(r["sim"]) for r in runs])}
    drift = {"vs_sim": {}, "self": {}, "self_ground_truth": {}}
    for key, cols in (("sharpness", [0]), ("colour", list(range(2, 2 + 3 * len(REGIONS))))):
        drift["vs_sim"][key] = round(float(np.mean(
            [r["model"][last][:, cols].mean() / r["sim"][last][:, cols].mean() for r in runs])), 3)
        drift["self"][key] = round(float(np.mean(
            [r["model"][last][:, cols].mean() / r["model"][EARLY][:, cols].mean()
             for r in runs])), 3)
        drift["self_ground_truth"][key] = round(float(np.mean(
            [r["sim"][last][:, cols].mean() / r["sim"][EARLY][:, cols].mean() for r in runs])), 3)
    out[f"drift_ratio_{length}"] = drift
    out[f"drift_ratio_{length}_ground_truth"] = {"vs_sim": {"sharpness": 1.0, "colour": 1.0},
                                                 "self": drift["self_ground_truth"]}
    return out
