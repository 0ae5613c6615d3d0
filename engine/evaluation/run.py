"""``worldstream eval``: the built-in model against the simulator, same start state and actions,
on held-out world seeds (training seeds stay below ``HELDOUT_SEED0``).

Metrics (see issue "Built-in world model"):
``ae_psnr_db`` autoencoder reconstruction; ``teacher_forced_psnr_db`` next chunk given the true
context; ``rollout_psnr_db_16`` frames 1-16 of a free rollout; ``action_accuracy`` fraction of
generated chunks whose dominant image motion (phase correlation) matches the simulator camera's
motion, idle included; ``prompt_switch_accuracy`` fraction of frames 1-2 s after a prompt switch
that a colour classifier fitted on simulator frames assigns to the new scene;
``drift_ratio_3000`` sharpness and mean colour of frames 2900-3000 of a free rollout over the
same for frames 50-150. Every metric is also computed on the ground-truth frames
(``*_ground_truth``) to show the metric itself is sound.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch
from tqdm import tqdm

from engine.backend import ChunkJob
from engine.evaluation.metrics import SceneClassifier, image_shift, motion_class, psnr, sharpness
from engine.generator import WorldGenerator
from engine.models.autoencoder import frames_to_tensor, tensor_to_frames
from engine.training.data import HELDOUT_SEED0
from engine.worlds.recorder import HumanLikePolicy
from engine.worlds.scenes import SCENE_NAMES, SCENES
from engine.worlds.simulator import WorldSimulator

FPS = 15


@dataclass
class Episode:
    frames: np.ndarray  # (L, H, W, 3) uint8
    actions: list[int]  # (L,) action that produced each frame
    offsets: np.ndarray  # (L, 2) integer camera offset (x, y) of each frame
    scene: str
    prompt: str


def record(
    seed: int,
    length: int,
    scene: str | None = None,
    switch_at: int | None = None,
    switch_to: str | None = None,
) -> Episode:
    """A held-out episode of human-like play (camera offsets kept for motion ground truth)."""
    rng = np.random.default_rng([seed, 7])
    scene = scene or SCENE_NAMES[int(rng.integers(len(SCENE_NAMES)))]
    sim = WorldSimulator(seed, scene)
    policy = HumanLikePolicy(rng)
    frames, actions, offsets = [], [], []
    for i in range(length):
        if switch_at is not None and i == switch_at:
            sim.set_scene(switch_to)
        a = policy()
        frames.append(sim.step(a))
        actions.append(a)
        offsets.append(sim.crop_origin())
    prompt = SCENES[scene]["prompts"][int(rng.integers(len(SCENES[scene]["prompts"])))]
    return Episode(np.stack(frames), actions, np.stack(offsets), scene, prompt)


def _chunks(ep: Episode, f: int, start: int = 1):
    """(index, actions) of each chunk after the first one."""
    for c in range(start, len(ep.actions) // f):
        yield c, ep.actions[c * f : (c + 1) * f]


def ae_psnr(gen: WorldGenerator, frames: np.ndarray) -> float:
    with torch.no_grad():
        x = frames_to_tensor(frames).to(gen.device, gen.config.dtype)
        y = gen.ae.decoder(gen.ae.encoder(x)).float().clamp(-1, 1)
    rec = tensor_to_frames(y).cpu().numpy()
    return float(np.mean([psnr(a, b) for a, b in zip(rec, frames)]))


def teacher_forced(gen: WorldGenerator, ep: Episode, steps: int, seed: int) -> list[float]:
    """PSNR of each chunk generated from the true context (a fork per chunk)."""
    f = gen.chunk_frames
    state = gen.new_state(ep.prompt, seed, start_frames=ep.frames[:f])
    scores = []
    try:
        for c, acts in _chunks(ep, f):
            branch = gen.fork(state)
            (res,) = gen.generate([ChunkJob(branch, acts, steps, seed=seed + c)])
            gen.free(branch)
            if res.error:
                raise res.error
            scores += [psnr(a, b) for a, b in zip(res.frames, ep.frames[c * f : (c + 1) * f])]
            gen.observe(state, ep.frames[c * f : (c + 1) * f], acts)
    finally:
        gen.free(state)
    return scores


def rollout(
    gen: WorldGenerator, ep: Episode, steps: int, seed: int, switch: tuple[int, str] | None = None
) -> np.ndarray:
    """Free rollout from the true first chunk with the episode's actions; ``switch`` =
    (chunk index, new prompt). Returns all frames, the true first chunk included."""
    f = gen.chunk_frames
    state = gen.new_state(ep.prompt, seed, start_frames=ep.frames[:f])
    out = [ep.frames[:f]]
    try:
        for c, acts in _chunks(ep, f):
            if switch is not None and c == switch[0]:
                gen.set_prompt(state, switch[1])
            (res,) = gen.generate([ChunkJob(state, acts, steps, seed=seed + c)])
            if res.error:
                raise res.error
            out.append(res.frames)
    finally:
        gen.free(state)
    return np.concatenate(out)


def action_hits(frames: np.ndarray, offsets: np.ndarray, f: int) -> list[bool]:
    """Per chunk: does the image motion from the frame before the chunk to its last frame
    match the camera's motion (content moves opposite to the camera)?"""
    hits = []
    for c in range(1, len(frames) // f):
        a, b = c * f - 1, (c + 1) * f - 1
        dx, dy = image_shift(frames[a], frames[b])
        cam = offsets[b] - offsets[a]
        hits.append(motion_class(dx, dy) == motion_class(-cam[0], -cam[1]))
    return hits


def drift(gen: WorldGenerator, ep_seed: int, steps: int, length: int = 3000) -> dict:
    """Free rollout of ``length`` frames; sharpness and mean colour of the last 100 frames over
    frames 50-150 (only those are decoded), and frames 50-150 against real frames."""
    f = gen.chunk_frames
    ep = record(ep_seed, length)
    state = gen.new_state(ep.prompt, ep_seed, start_frames=ep.frames[:f])
    early, late = [], []
    try:
        for c, acts in tqdm(list(_chunks(ep, f)), desc="drift rollout", unit="chunk", leave=False):
            (res,) = gen.generate([ChunkJob(state, acts, steps, seed=ep_seed + c)], decode=False)
            if res.error:
                raise res.error
            first = c * f
            if 50 <= first < 150 or first >= length - 100:
                rgb = gen.decode_latents(state.history[-1].latents)
                (early if first < 150 else late).extend(rgb)
    finally:
        gen.free(state)
    s_early = np.mean([sharpness(x) for x in early])
    s_late = np.mean([sharpness(x) for x in late])
    s_real = np.mean([sharpness(x) for x in ep.frames[50:150]])
    c_early = np.mean(np.stack(early), axis=(0, 1, 2))
    c_late = np.mean(np.stack(late), axis=(0, 1, 2))
    return {
        "sharpness": round(float(s_late / s_early), 3),
        "colour": round(float(c_late.mean() / c_early.mean()), 3),
        "colour_rgb": [round(float(x), 3) for x in c_late / c_early],
        "sharpness_vs_real_50_150": round(float(s_early / s_real), 3),
    }


def _scene_classifier(n_frames: int = 48) -> SceneClassifier:
    by_scene = {}
    for k, scene in enumerate(SCENE_NAMES):
        by_scene[scene] = np.concatenate(
            [record(1000 + 10 * k + j, n_frames, scene).frames for j in range(2)]
        )
    return SceneClassifier(by_scene)


def evaluate(
    gen: WorldGenerator, quick: bool = True, steps: int = 4, drift_steps: int | None = None
) -> dict:
    """Run every metric; ``quick`` uses fewer episodes (<= 2 minutes on a 2-core CPU)."""
    t0 = time.perf_counter()
    f = gen.chunk_frames
    n_ep, n_chunks = (3, 10) if quick else (12, 20)
    seeds = [HELDOUT_SEED0 + 100 + i for i in range(n_ep)]
    episodes = [record(s, (n_chunks + 1) * f) for s in seeds]
    out: dict = {"quick": quick, "steps": steps, "episodes": n_ep}
    out["ae_psnr_db"] = round(np.mean([ae_psnr(gen, ep.frames) for ep in episodes]), 2)
    tf = [s for ep, sd in zip(episodes, seeds) for s in teacher_forced(gen, ep, steps, sd)]
    out["teacher_forced_psnr_db"] = round(float(np.mean(tf)), 2)
    copy = [
        psnr(ep.frames[i], ep.frames[i - 1]) for ep in episodes for i in range(f, len(ep.frames))
    ]
    out["copy_last_frame_psnr_db"] = round(float(np.mean(copy)), 2)  # the trivial baseline
    rolls = [rollout(gen, ep, steps, sd) for ep, sd in zip(episodes, seeds)]
    out["rollout_psnr_db_16"] = round(
        float(
            np.mean(
                [
                    psnr(r[i], ep.frames[i])
                    for r, ep in zip(rolls, episodes)
                    for i in range(f, f + 16)
                ]
            )
        ),
        2,
    )
    hits = [h for r, ep in zip(rolls, episodes) for h in action_hits(r, ep.offsets, f)]
    truth = [h for ep in episodes for h in action_hits(ep.frames, ep.offsets, f)]
    out["action_accuracy"] = round(float(np.mean(hits)), 3)
    out["action_accuracy_ground_truth"] = round(float(np.mean(truth)), 3)
    # prompt switches: one second in the old scene, then two in the new one
    clf = _scene_classifier()
    switch_chunk = FPS // f + 1
    n_sw = 4 if quick else 12
    got, truth = [], []
    for i in range(n_sw):
        a, b = SCENE_NAMES[i % 4], SCENE_NAMES[(i + 1 + i // 4) % 4]
        sw_frame = switch_chunk * f
        ep = record(
            HELDOUT_SEED0 + 200 + i,
            sw_frame + 2 * FPS + f,
            scene=a,
            switch_at=sw_frame,
            switch_to=b,
        )
        new_prompt = SCENES[b]["prompts"][i % len(SCENES[b]["prompts"])]
        frames = rollout(gen, ep, steps, HELDOUT_SEED0 + 200 + i, (switch_chunk, new_prompt))
        window = range(sw_frame + FPS, sw_frame + 2 * FPS)
        got += [clf.predict(frames[j]) == b for j in window]
        truth += [clf.predict(ep.frames[j]) == b for j in window]
    out["prompt_switch_accuracy"] = round(float(np.mean(got)), 3)
    out["prompt_switch_accuracy_ground_truth"] = round(float(np.mean(truth)), 3)
    out["drift_steps"] = drift_steps or (1 if quick else steps)
    out["drift_ratio_3000"] = drift(gen, HELDOUT_SEED0 + 300, out["drift_steps"])
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    return out
