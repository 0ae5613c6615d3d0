"""``worldstream eval``: the built-in model against the simulator, same start state and actions,
on held-out world seeds (training seeds stay below ``HELDOUT_SEED0``).

Metrics:
``ae_psnr_db`` autoencoder reconstruction; ``teacher_forced_psnr_db`` next chunk given the true
context; ``rollout_psnr_db_16`` frames 1-16 of a free rollout; ``action_accuracy`` fraction of
generated chunks whose dominant image motion (phase correlation, from the frame before the chunk
to its last frame: zero-frame offset) matches the simulator camera's motion, idle included, a
pixel step either way of the camera's sub-pixel path accepted (``action_accuracy_strict``: the
simulator's own integer steps; ``*_phase_twin``: both scored on the simulator started at another
sub-pixel phase, see :func:`action_hits`);
``prompt_switch_accuracy`` fraction of frames 1-2 s after a prompt switch that a colour
classifier fitted on simulator frames assigns to the new scene; ``revisit_psnr_db`` a loop out
and back to the same camera position, the frame after the loop against the frame before it
(both generated; ``revisit_generated_psnr_db`` the same after a travel away from the start
view, on ground the model generated); ``rollout_sharpness_ratio`` min over 40-frame
segments of frames 0-600 of a moving free rollout of the model's sharpness over the
simulator's on the same actions (``rollout_sharpness_ratio_max`` the max: the goal is a range);
``rollout_anisotropy`` max over the same segments of the gradient anisotropy (streaks);
``rollout_off_palette`` max over the same segments of the fraction of pixels off the scene's
palette (:class:`~worldstream.engine.evaluation.metrics.ScenePalette`: colours the simulator
never draws there; ``_mean`` over all those frames, ``_autoencoder`` the autoencoder's round
trip of the simulator's frames, the floor);
``rollout_luma_drift_max_abs`` max over the same segments of |mean luma of the model's frames
minus the simulator's| (levels: a world that turns into another scene early);
``drift_ratio_3000`` sharpness and mean colour of frames L-100..L against the simulator's
frames L-100..L (``vs_sim``) and against the rollout's own frames 50-150 (``self``);
``picture_start_psnr_1_16`` frames 1-16 after starting from a held-out simulator frame
uploaded as a picture (``engine.evaluation.picture_start``); ``luma_drift`` mean luma
of frames L-100..L minus the simulator's, idle and moving, every
scene (its twin ``luma_drift_ground_truth``: the RMS of the same difference for
:data:`~worldstream.engine.evaluation.drift.OTHER_WORLDS` other simulated worlds of the scene
on the same actions, the spread a right world that is not this one shows). Every metric is
also computed on the ground-truth frames (``*_ground_truth``) to show the metric itself is
sound.
"""

from __future__ import annotations

import time

import numpy as np

from worldstream.engine.backends.builtin import BuiltinBackend
from worldstream.engine.evaluation.drift import drift_metrics, long_rollouts
from worldstream.engine.evaluation.episodes import record, rollout, teacher_forced
from worldstream.engine.evaluation.metrics import (
    SceneClassifier,
    image_shift,
    motion_class,
    psnr,
)
from worldstream.engine.evaluation.picture_start import PICTURE_AT, picture_start_metrics
from worldstream.engine.training.data import HELDOUT_SEED0
from worldstream.engine.worlds.actions import IDLE, direction_to_action
from worldstream.engine.worlds.scenes import SCENE_NAMES, SCENES

FPS = 15
RIGHT, LEFT = direction_to_action(1, 0), direction_to_action(-1, 0)
DOWN, UP = direction_to_action(0, 1), direction_to_action(0, -1)


def ae_psnr(gen: BuiltinBackend, frames: np.ndarray) -> float:
    """Mean PSNR (dB) of the autoencoder's reconstructions, at the streaming dtype."""
    rec = gen.decode_latents(gen.encode_frames(frames))
    return float(np.mean([psnr(a, b) for a, b in zip(rec, frames)]))


def action_hits(frames: np.ndarray, camera: np.ndarray, f: int) -> list[bool]:
    """Per chunk: does the image motion from the frame before the chunk to its last frame
    match the camera's motion (content moves opposite to the camera)?

    ``frames (L, H, W, 3)`` uint8; ``camera (L, 2)`` the camera path, world px: the integer
    crop origins (``Episode.offsets``: the simulator's own pixel steps must be matched, the
    *strict* reading) or the continuous positions (``Episode.positions``). A frame is a crop at
    integer pixels of a camera at sub-pixel positions, so moving ``d`` px shifts it by
    ``floor(d)`` or ``ceil(d)`` px depending on the sub-pixel phase, which no frame shows: the
    simulator itself, started at another phase (``record(subpixel=...)``), misses some of the
    strict reading. Given positions, the motion of either pixel step is a hit, per axis; a
    still picture still fails wherever the camera moves a pixel or more. The first frame after
    a key from rest moves under a pixel, so only the strict reading asks it to show a step."""
    hits = []
    for c in range(1, len(frames) // f):
        a, b = c * f - 1, (c + 1) * f - 1
        got = motion_class(*image_shift(frames[a], frames[b]))
        d = -(np.asarray(camera[b], np.float64) - np.asarray(camera[a], np.float64))
        # per axis, the content's direction for either pixel step
        allowed = [{motion_class(step, 0.0)[0] for step in (np.floor(v), np.ceil(v))} for v in d]
        hits.append(got[0] in allowed[0] and got[1] in allowed[1])
    return hits


#: out along a path and back: 16 frames of a key, coast to rest, the opposite key, coast to rest
#: (the simulator's dynamics are sign-symmetric, so the camera returns to the same pixel)
def revisit_actions(key: int, back: int, hold: int = 16, coast: int = 40) -> list[int]:
    return [IDLE] * 4 + [key] * hold + [IDLE] * coast + [back] * hold + [IDLE] * coast


#: the travel before a loop that starts on generated ground: a key at right angles to the
#: loop held 24 frames, then a coast to rest (149 px: the start view is out of sight)
def travel_actions(key: int, hold: int = 24, coast: int = 40) -> list[int]:
    return [key] * hold + [IDLE] * coast


def revisit(gen: BuiltinBackend, steps: int, episodes: int, travel: bool = False) -> dict:
    """PSNR of the frame after a loop against the frame before it, both generated (and both
    real for the ground truth), over loops in the four directions. The loops start in the
    stream's start view (``revisit_psnr_db``), or with ``travel`` after :func:`travel_actions`
    on ground the model generated (``revisit_generated_psnr_db``): the start frames are real
    and final in memory, so a loop back to them reads the start picture, while a loop on
    generated ground reads what the model wrote and rewrote there."""
    got, truth = [], []
    pairs = [(RIGHT, LEFT), (DOWN, UP), (LEFT, RIGHT), (UP, DOWN)]
    across = {RIGHT: DOWN, DOWN: RIGHT, LEFT: UP, UP: LEFT}
    for i in range(episodes):
        key, back = pairs[i % 4]
        acts = revisit_actions(key, back)
        if travel:
            acts = acts[:4] + travel_actions(across[key]) + acts[4:]
        seed = HELDOUT_SEED0 + 400 + i
        ep = record(seed, len(acts), actions=acts)
        before = len(acts) - len(revisit_actions(key, back)) + 3
        if not np.array_equal(ep.offsets[before], ep.offsets[-1]):
            raise RuntimeError("revisit script did not return the simulator's camera")
        frames = rollout(gen, ep, steps, seed)
        got.append(psnr(frames[-1], frames[before]))
        truth.append(psnr(ep.frames[-1], ep.frames[before]))
    name = "revisit_generated_psnr_db" if travel else "revisit_psnr_db"
    return {name: round(float(np.mean(got)), 2),
            f"{name}_ground_truth": round(float(np.mean(truth)), 2)}


def scene_classifier(n_frames: int = 48) -> SceneClassifier:
    by_scene = {}
    for k, scene in enumerate(SCENE_NAMES):
        by_scene[scene] = np.concatenate(
            [record(1000 + 10 * k + j, n_frames, scene).frames for j in range(2)]
        )
    return SceneClassifier(by_scene)


def evaluate(
    gen: BuiltinBackend, quick: bool = True, steps: int = 4, drift_steps: int | None = None
) -> dict:
    """Run every metric; ``quick`` uses fewer episodes (<= 2 minutes on a 2-core CPU)."""
    t0 = time.perf_counter()
    f = gen.chunk_frames
    n_ep, n_frames = (3, 20) if quick else (12, 40)
    seeds = [HELDOUT_SEED0 + 100 + i for i in range(n_ep)]
    episodes = [record(s, n_frames + f) for s in seeds]
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
    # a start from a picture (a simulator frame taken after some play)
    long_eps = [record(s, PICTURE_AT + 17) for s in seeds]
    out.update(picture_start_metrics(gen, long_eps, seeds, steps))
    twins = [record(s, n_frames + f, subpixel=(0.5, 0.5)).frames for s in seeds]
    for name, path in (("action_accuracy", "positions"), ("action_accuracy_strict", "offsets")):
        for suffix, videos in (("", rolls), ("_ground_truth", [ep.frames for ep in episodes]),
                               ("_phase_twin", twins)):
            hits = [h for r, ep in zip(videos, episodes)
                    for h in action_hits(r, getattr(ep, path), f)]
            out[name + suffix] = round(float(np.mean(hits)), 3)
    # prompt switches: one second in the old scene, then two in the new one
    clf = scene_classifier()
    switch_chunk = FPS // f + 1
    n_sw = 4 if quick else 12
    got, truth = [], []
    for i in range(n_sw):
        a, b = SCENE_NAMES[i % 4], SCENE_NAMES[(i + 1 + i // 4) % 4]
        sw_frame = switch_chunk * f
        ep = record(HELDOUT_SEED0 + 200 + i, sw_frame + 2 * FPS + f, a, {sw_frame: b})
        new_prompt = SCENES[b]["prompts"][i % len(SCENES[b]["prompts"])]
        frames = rollout(gen, ep, steps, HELDOUT_SEED0 + 200 + i, {switch_chunk: new_prompt})
        window = range(sw_frame + FPS, sw_frame + 2 * FPS)
        got += [clf.predict(frames[j]) == b for j in window]
        truth += [clf.predict(ep.frames[j]) == b for j in window]
    out["prompt_switch_accuracy"] = round(float(np.mean(got)), 3)
    out["prompt_switch_accuracy_ground_truth"] = round(float(np.mean(truth)), 3)
    out.update(revisit(gen, steps, 4 if quick else 8))
    out.update(revisit(gen, steps, 4 if quick else 8, travel=True))
    out["drift_steps"] = drift_steps or steps
    length = 600 if quick else 3000
    scenes = SCENE_NAMES[:2] if quick else list(SCENE_NAMES)
    out.update(drift_metrics(long_rollouts(gen, out["drift_steps"], length, scenes)))
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    return out
