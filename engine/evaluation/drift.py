"""The long-rollout metrics: idle and moving rollouts of hundreds to thousands of
frames against the simulator on the same actions, kept as per-frame statistics, and reduced to
sharpness, anisotropy, luma and colour drift, off-palette and fragmentation figures, each with
its ground-truth twin."""

from __future__ import annotations

import numpy as np

from worldstream.engine.backends.builtin import BuiltinBackend
from worldstream.engine.evaluation.episodes import record, streamed_rollout
from worldstream.engine.evaluation.metrics import (
    ScenePalette,
    anisotropy,
    boundary_density,
    mean_luma,
    sharpness,
)
from worldstream.engine.training.data import HELDOUT_SEED0
from worldstream.engine.worlds.actions import IDLE
from worldstream.engine.worlds.scenes import SCENE_NAMES
from worldstream.engine.worlds.scenes import palette as class_palette

#: the segment metrics read frames 0..SEGMENT_FRAMES of the moving rollouts
SEGMENT_FRAMES = 600
#: luma_drift's ground-truth twin reads this many other simulated worlds of each run's scene,
#: world seeds this far apart (held-out seeds still)
OTHER_WORLDS = 3
OTHER_WORLD_STRIDE = 10_000


def segment_scores(model: np.ndarray, sim: np.ndarray, segment: int = 40) -> dict:
    """Per ``segment``-frame segment: mean sharpness of the model's frames over the
    simulator's, mean anisotropy of each, and the model's mean luma minus the simulator's
    (levels); ``model``/``sim`` are ``(L, 3+)`` per-frame (sharpness, anisotropy, luma, ...)
    rows."""
    m = np.array([segment_means(model[:, k], segment) for k in range(3)])
    t = np.array([segment_means(sim[:, k], segment) for k in range(3)])
    return {"sharpness_ratio": list(m[0] / t[0]), "anisotropy": list(m[1]),
            "anisotropy_sim": list(t[1]), "luma": list(m[2] - t[2])}


def segment_means(values: np.ndarray, segment: int = 40) -> list[float]:
    """Mean of each whole ``segment``-frame segment of per-frame ``values`` ``(L,)``."""
    return [float(np.mean(values[a : a + segment]))
            for a in range(0, len(values) - segment + 1, segment)]


def frame_stats(rgb: np.ndarray) -> tuple[float, float, float, float, float, float]:
    """(sharpness, anisotropy, luma, mean R, mean G, mean B) of a frame."""
    return (sharpness(rgb), anisotropy(rgb), mean_luma(rgb), *rgb.reshape(-1, 3).mean(0))


def long_rollouts(gen: BuiltinBackend, steps: int, length: int, scenes: list[str]) -> dict:
    """For each scene, an idle and a moving rollout of ``length`` frames against the simulator
    on the same actions: per-frame statistics of both, reduced to the drift metrics. Moving
    runs also keep the off-palette fraction (:class:`ScenePalette`) of their first
    :data:`SEGMENT_FRAMES` frames: the model's (``off_palette``), the simulator's
    (``off_palette_sim``) and the autoencoder's round trip of every 10th simulator frame
    (``off_palette_autoencoder``, the floor a model behind this autoencoder can reach), and
    the terrain-class boundary density (:func:`boundary_density`) of the same frames: the
    model's (``fragmentation``), the simulator's (``fragmentation_sim``), the
    autoencoder's round trip (``fragmentation_autoencoder``, every 10th frame) and the
    simulator's in the other worlds of the luma twin on the same actions
    (``fragmentation_other_worlds``, ``(OTHER_WORLDS, head)``)."""
    out: dict = {"length": length, "scenes": scenes, "runs": []}
    for k, scene in enumerate(scenes):
        palette, classes = scene_palette(scene), class_palette(scene)
        for moving in (False, True):
            seed = HELDOUT_SEED0 + 300 + 2 * k + int(moving)
            acts = None if moving else [IDLE] * length
            ep = record(seed, length, scene=scene, actions=acts)
            stats = np.zeros((length, 6))
            stats[: gen.chunk_frames] = [frame_stats(x) for x in ep.frames[: gen.chunk_frames]]
            head = min(SEGMENT_FRAMES, length) if moving else 0
            off_sim = np.array([palette.off_fraction(x) for x in ep.frames[:head]])
            frag_sim = np.array([boundary_density(x, classes) for x in ep.frames[:head]])
            # the first chunk is the true one; the rest is overwritten
            off, frag = off_sim.copy(), frag_sim.copy()

            def keep(i, frame, stats=stats, off=off, frag=frag, palette=palette,
                     classes=classes):
                stats[i] = frame_stats(frame)
                if i < len(off):
                    off[i] = palette.off_fraction(frame)
                    frag[i] = boundary_density(frame, classes)

            streamed_rollout(gen, ep, steps, seed, keep)
            real = np.array([frame_stats(x) for x in ep.frames])
            # the twins of luma_drift and fragmentation: other worlds of the scene on the
            # same actions
            others_luma, others_frag = [], []
            for j in range(OTHER_WORLDS):
                other = record(seed + OTHER_WORLD_STRIDE * (j + 1), length, scene,
                               actions=ep.actions).frames
                others_luma.append(float(np.mean([mean_luma(x) for x in other[-100:]])))
                others_frag.append([boundary_density(x, classes) for x in other[:head]])
            run = {"scene": scene, "moving": moving, "model": stats, "sim": real,
                   "other_worlds_luma": others_luma}
            if moving:
                run["off_palette"], run["off_palette_sim"] = off, off_sim
                run["fragmentation"], run["fragmentation_sim"] = frag, frag_sim
                run["fragmentation_other_worlds"] = np.array(others_frag)
                rec = gen.decode_latents(gen.encode_frames(ep.frames[:head:10]))
                run["off_palette_autoencoder"] = np.array([palette.off_fraction(x) for x in rec])
                run["fragmentation_autoencoder"] = np.array(
                    [boundary_density(x, classes) for x in rec])
            out["runs"].append(run)
    return out


def scene_palette(scene: str, worlds: int = 6, frames: int = 120) -> ScenePalette:
    """The colours the simulator draws in ``scene``: every 4th frame of ``frames`` frames of
    human-like play in ``worlds`` held-out worlds that no evaluation episode uses."""
    k = SCENE_NAMES.index(scene)
    return ScenePalette(np.concatenate(
        [record(HELDOUT_SEED0 + 600 + 10 * k + j, frames, scene).frames[::4]
         for j in range(worlds)]))


def fragmentation_metrics(moving: list[dict]) -> dict:
    """``rollout_fragmentation``: the largest ratio, over the 40-frame segments of the moving
    runs of :func:`long_rollouts`, of the model's mean terrain-class boundary density to the
    simulator's on the same frames (1 = regions as large as the world's; a mottle reads 2-4);
    ``_mean`` the ratio of the runs' whole means, averaged over runs; ``_ground_truth`` the
    same worst-segment ratio for the simulator's other worlds of each run's scene on the same
    actions (a right world that is not this one: how far the ratio strays with no fault);
    ``_autoencoder`` the largest ratio of a run's autoencoder round trip (every 10th frame)
    to the simulator's same frames."""
    def worst(frames: np.ndarray, sim: np.ndarray) -> float:
        return max(a / b for a, b in zip(segment_means(frames), segment_means(sim)))

    return {
        "rollout_fragmentation": round(float(max(
            worst(r["fragmentation"], r["fragmentation_sim"]) for r in moving)), 3),
        "rollout_fragmentation_mean": round(float(np.mean(
            [np.mean(r["fragmentation"]) / np.mean(r["fragmentation_sim"]) for r in moving])), 3),
        "rollout_fragmentation_ground_truth": round(float(max(
            worst(other, r["fragmentation_sim"]) for r in moving
            for other in r["fragmentation_other_worlds"])), 3),
        "rollout_fragmentation_autoencoder": round(float(max(
            np.mean(r["fragmentation_autoencoder"]) / np.mean(r["fragmentation_sim"][::10])
            for r in moving)), 3),
    }


def drift_metrics(runs: dict) -> dict:
    """The drift figures of :func:`long_rollouts`' per-frame statistics."""
    n = runs["length"]
    last, early = slice(n - 100, n), slice(50, 150)
    moving = [r for r in runs["runs"] if r["moving"]]
    head = min(SEGMENT_FRAMES, n)
    segs = [segment_scores(r["model"][:head], r["sim"][:head]) for r in moving]
    # NOTE: the goal is a range, so the maximum counts too (a dark world turned bright reads
    # far sharper than the simulator); the segments' luma catches it early, where luma_drift
    # only reads the last frames
    out = {
        "rollout_sharpness_ratio": round(float(min(min(s["sharpness_ratio"]) for s in segs)), 3),
        "rollout_sharpness_ratio_max": round(
            float(max(max(s["sharpness_ratio"]) for s in segs)), 3),
        "rollout_luma_drift_max_abs": round(
            float(max(max(abs(v) for v in s["luma"]) for s in segs)), 2),
        "rollout_anisotropy": round(float(max(max(s["anisotropy"]) for s in segs)), 3),
        "rollout_anisotropy_ground_truth": round(
            float(max(max(s["anisotropy_sim"]) for s in segs)), 3
        ),
    }
    if all("off_palette" in r for r in moving):
        # NOTE: sharpness counts edges, not whether they are the world's colours: a mottle
        # of wrong colours passes it
        out["rollout_off_palette"] = round(float(max(
            max(segment_means(r["off_palette"])) for r in moving)), 3)
        out["rollout_off_palette_mean"] = round(float(np.mean(
            [np.mean(r["off_palette"]) for r in moving])), 3)
        out["rollout_off_palette_ground_truth"] = round(float(max(
            max(segment_means(r["off_palette_sim"])) for r in moving)), 3)
        out["rollout_off_palette_autoencoder"] = round(float(max(
            np.mean(r["off_palette_autoencoder"]) for r in moving)), 3)
    if all("fragmentation" in r for r in moving):
        # NOTE: a mottle of the scene's own colours passes the off-palette figure; this
        # reads the worst segment's terrain-class boundaries per pixel pair over the simulator's
        out.update(fragmentation_metrics(moving))

    drift = {"vs_sim": {}, "self": {}}
    for key, cols in (("sharpness", [0]), ("colour", [3, 4, 5])):
        drift["vs_sim"][key] = round(
            float(np.mean([r["model"][last][:, cols].mean() / r["sim"][last][:, cols].mean()
                           for r in moving])), 3)
        drift["self"][key] = round(
            float(np.mean([r["model"][last][:, cols].mean() / r["model"][early][:, cols].mean()
                           for r in moving])), 3)
    drift["self_ground_truth"] = {
        "sharpness": round(float(np.mean([r["sim"][last][:, 0].mean() / r["sim"][early][:, 0].mean()
                                          for r in moving])), 3),
    }
    out[f"drift_ratio_{n}"] = drift
    luma = {
        f"{r['scene']}_{'moving' if r['moving'] else 'idle'}": round(
            float(r["model"][last, 2].mean() - r["sim"][last, 2].mean()), 2
        )
        for r in runs["runs"]
    }
    out["luma_drift"] = luma
    out["luma_drift_max_abs"] = round(float(max(abs(v) for v in luma.values())), 2)
    # NOTE: the model invents the ground it reveals, so the right twin is not the simulator
    # against itself (0) but another world of the same scene: right, yet not this one
    twin = {f"{r['scene']}_{'moving' if r['moving'] else 'idle'}": round(float(np.sqrt(np.mean(
        np.square(np.asarray(r["other_worlds_luma"]) - r["sim"][last, 2].mean())))), 2)
        for r in runs["runs"] if r.get("other_worlds_luma")}
    if twin:
        out["luma_drift_ground_truth"] = twin
        out["luma_drift_ground_truth_max"] = max(twin.values())
    return out
