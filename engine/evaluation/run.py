"""``worldstream eval``: the built-in model against the simulator, same start state and actions,
on held-out world seeds (training seeds stay below ``HELDOUT_SEED0``).

Metrics (issues 2 and 11):
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
:data:`OTHER_WORLDS` other simulated worlds of the scene on the same actions, the spread a
right world that is not this one shows). Every metric is also computed on the ground-truth
frames (``*_ground_truth``) to show the metric itself is sound.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from tqdm import tqdm

from worldstream.engine.backends.builtin import BuiltinBackend
from worldstream.engine.core.backend import ChunkJob
from worldstream.engine.evaluation.metrics import (
    SceneClassifier,
    ScenePalette,
    anisotropy,
    boundary_density,
    image_shift,
    mean_luma,
    motion_class,
    psnr,
    sharpness,
)
from worldstream.engine.evaluation.picture_start import PICTURE_AT, picture_start_metrics
from worldstream.engine.training.data import HELDOUT_SEED0
from worldstream.engine.worlds.actions import IDLE, direction_to_action
from worldstream.engine.worlds.recorder import HumanLikePolicy
from worldstream.engine.worlds.scenes import SCENE_NAMES, SCENES
from worldstream.engine.worlds.scenes import palette as class_palette
from worldstream.engine.worlds.simulator import WorldSimulator

FPS = 15
RIGHT, LEFT = direction_to_action(1, 0), direction_to_action(-1, 0)
DOWN, UP = direction_to_action(0, 1), direction_to_action(0, -1)


@dataclass
class Episode:
    frames: np.ndarray  # (L, H, W, 3) uint8
    actions: list[int]  # (L,) action that produced each frame
    offsets: np.ndarray  # (L, 2) integer camera offset (x, y) of each frame
    scene: str
    prompt: str
    positions: np.ndarray | None = None  # (L, 2) float64 camera centre (x, y), world px
    # (H, W, 3) uint8 the scene behind the subject (the avatar's background plate), given to
    # the stream as a live one gets it (BuiltinBackend.set_backdrop); None: none
    backdrop: np.ndarray | None = None


def start_stream(gen: BuiltinBackend, ep: Episode, seed: int, frames: int):
    """A stream of ``ep`` from its first ``frames`` true frames (noise ``seed``), with the
    episode's backdrop: the state, as ``gen.new_state`` returns it."""
    state = gen.new_state(ep.prompt, seed, start_frames=ep.frames[:frames])
    if ep.backdrop is not None:
        gen.set_backdrop(state, ep.backdrop)
    return state


def record(
    seed: int,
    length: int,
    scene: str | None = None,
    switches: dict[int, str] | None = None,
    actions: list[int] | None = None,
    subpixel: tuple[float, float] | None = None,
) -> Episode:
    """A held-out episode of human-like play, or of the given ``actions``; ``switches`` maps a
    frame index to the scene switched to there (camera offsets and positions kept for motion
    ground truth). ``subpixel``: start the camera at that fraction of a pixel (x, y) in [0, 1)
    instead of the seed's (the same world and play, the crops' integer steps falling on other
    frames)."""
    rng = np.random.default_rng([seed, 7])
    scene = scene or SCENE_NAMES[int(rng.integers(len(SCENE_NAMES)))]
    sim = WorldSimulator(seed, scene)
    if subpixel is not None:
        sim.pos = np.floor(sim.pos) + np.asarray(subpixel, np.float64)
    policy = HumanLikePolicy(rng) if actions is None else iter(actions).__next__
    frames, actions, offsets, positions = [], [], [], []
    for i in range(length):
        if switches and i in switches:
            sim.set_scene(switches[i])
        a = policy()
        frames.append(sim.step(a))
        actions.append(a)
        offsets.append(sim.crop_origin())
        positions.append(sim.pos.copy())
    prompt = SCENES[scene]["prompts"][int(rng.integers(len(SCENES[scene]["prompts"])))]
    return Episode(np.stack(frames), actions, np.stack(offsets), scene, prompt,
                   np.stack(positions))


def _chunks(ep: Episode, f: int, start: int = 1):
    """(index, actions) of each chunk after the first one."""
    for c in range(start, len(ep.actions) // f):
        yield c, ep.actions[c * f : (c + 1) * f]


def ae_psnr(gen: BuiltinBackend, frames: np.ndarray) -> float:
    """Mean PSNR (dB) of the autoencoder's reconstructions, at the streaming dtype."""
    rec = gen.decode_latents(gen.encode_frames(frames))
    return float(np.mean([psnr(a, b) for a, b in zip(rec, frames)]))


def teacher_forced(gen: BuiltinBackend, ep: Episode, steps: int, seed: int) -> list[float]:
    """PSNR of each chunk generated from the true context (a fork per chunk)."""
    f = gen.chunk_frames
    state = start_stream(gen, ep, seed, f)
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
    gen: BuiltinBackend,
    ep: Episode,
    steps: int,
    seed: int,
    switches: dict[int, str] | None = None,
) -> np.ndarray:
    """Free rollout from the true first chunk with the episode's actions; ``switches`` maps a
    chunk index to the prompt switched to before it. Returns all frames, the true first chunk
    included."""
    out = ep.frames.copy()
    streamed_rollout(gen, ep, steps, seed, out.__setitem__, switches)
    return out[: len(ep.actions) // gen.chunk_frames * gen.chunk_frames]


def action_hits(frames: np.ndarray, camera: np.ndarray, f: int) -> list[bool]:
    """Per chunk: does the image motion from the frame before the chunk to its last frame
    match the camera's motion (content moves opposite to the camera)?

    ``frames (L, H, W, 3)`` uint8; ``camera (L, 2)`` the camera path, world px: the integer
    crop origins (``Episode.offsets``: the simulator's own pixel steps must be matched, the
    *strict* reading) or the continuous positions (``Episode.positions``). A frame is a crop at
    integer pixels of a camera at sub-pixel positions, so moving ``d`` px shifts it by
    ``floor(d)`` or ``ceil(d)`` px depending on the sub-pixel phase, which no frame shows: the
    simulator itself, started at another phase (``record(subpixel=...)``), scores 0.89-0.94 on
    the strict reading of 12 held-out episodes. Given positions, the motion of either pixel
    step is a hit, per axis; a still picture still fails wherever the camera moves a pixel or
    more. The first frame after a key from rest moves 0.94 px, so only the strict reading asks
    it to show a step (the built-in stream's nearest-pixel camera does)."""
    hits = []
    for c in range(1, len(frames) // f):
        a, b = c * f - 1, (c + 1) * f - 1
        got = motion_class(*image_shift(frames[a], frames[b]))
        d = -(np.asarray(camera[b], np.float64) - np.asarray(camera[a], np.float64))
        # per axis, the content's direction for either pixel step
        allowed = [{motion_class(step, 0.0)[0] for step in (np.floor(v), np.ceil(v))} for v in d]
        hits.append(got[0] in allowed[0] and got[1] in allowed[1])
    return hits


def streamed_rollout(
    gen: BuiltinBackend,
    ep: Episode,
    steps: int,
    seed: int,
    on_frame,
    switches: dict[int, str] | None = None,
) -> None:
    """Free rollout of the whole episode from its true first chunk, calling
    ``on_frame(index, model_frame)`` for every generated frame (nothing is kept: long rollouts
    of thousands of frames stay in constant memory); ``switches`` as in :func:`rollout`."""
    f = gen.chunk_frames
    state = start_stream(gen, ep, seed, f)
    try:
        for c, acts in tqdm(list(_chunks(ep, f)), desc="rollout", unit="chunk", leave=False):
            if switches and c in switches:
                gen.set_prompt(state, switches[c])
            # the stream's own noise, as a live stream draws it (world-anchored on the
            # built-in model: per-chunk seeds would give every chunk its own noise field)
            (res,) = gen.generate([ChunkJob(state, acts, steps)])
            if res.error:
                raise res.error
            for i, frame in enumerate(res.frames):
                on_frame(c * f + i, frame)
    finally:
        gen.free(state)


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


def _frame_stats(rgb: np.ndarray) -> tuple[float, float, float, float, float, float]:
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
            stats[: gen.chunk_frames] = [_frame_stats(x) for x in ep.frames[: gen.chunk_frames]]
            head = min(SEGMENT_FRAMES, length) if moving else 0
            off_sim = np.array([palette.off_fraction(x) for x in ep.frames[:head]])
            frag_sim = np.array([boundary_density(x, classes) for x in ep.frames[:head]])
            # the first chunk is the true one; the rest is overwritten
            off, frag = off_sim.copy(), frag_sim.copy()

            def keep(i, frame, stats=stats, off=off, frag=frag, palette=palette,
                     classes=classes):
                stats[i] = _frame_stats(frame)
                if i < len(off):
                    off[i] = palette.off_fraction(frame)
                    frag[i] = boundary_density(frame, classes)

            streamed_rollout(gen, ep, steps, seed, keep)
            real = np.array([_frame_stats(x) for x in ep.frames])
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


#: the segment metrics read frames 0..SEGMENT_FRAMES of the moving rollouts (issue 11)
SEGMENT_FRAMES = 600


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


#: luma_drift's ground-truth twin reads this many other simulated worlds of each run's scene,
#: world seeds this far apart (held-out seeds still)
OTHER_WORLDS = 3
OTHER_WORLD_STRIDE = 10_000


def drift_metrics(runs: dict) -> dict:
    """The issue-11 drift numbers from :func:`long_rollouts`."""
    n = runs["length"]
    last, early = slice(n - 100, n), slice(50, 150)
    moving = [r for r in runs["runs"] if r["moving"]]
    head = min(SEGMENT_FRAMES, n)
    segs = [segment_scores(r["model"][:head], r["sim"][:head]) for r in moving]
    # NOTE: the goal is a range (0.6-1.6), and the minimum alone hid the other side: a night
    # world whose new ground came out as a bright day meadow read 4-8x the simulator's
    # sharpness (a dark world has little contrast to measure) and +40-57 levels of luma by
    # frame 40, where luma_drift only reads frames L-100..L; hence the maximum and the luma
    # of the same segments
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
        # NOTE: added after the sharpness ratio met its goal with the desert's new ground a
        # mottle of magenta and pale green (assets/builtin/detail_shading.png): sharpness
        # counts edges, not whether they are the world's colours
        out["rollout_off_palette"] = round(float(max(
            max(segment_means(r["off_palette"])) for r in moving)), 3)
        out["rollout_off_palette_mean"] = round(float(np.mean(
            [np.mean(r["off_palette"]) for r in moving])), 3)
        out["rollout_off_palette_ground_truth"] = round(float(max(
            max(segment_means(r["off_palette_sim"])) for r in moving)), 3)
        out["rollout_off_palette_autoencoder"] = round(float(max(
            np.mean(r["off_palette_autoencoder"]) for r in moving)), 3)
    if all("fragmentation" in r for r in moving):
        # NOTE: added when the sheet's moving snowy world was a mottle of the scene's own
        # colours (white, grey, green and blue blobs a few px across where the simulator has
        # regions tens of px across) that no other number read: the worst segment's
        # terrain-class boundaries per pixel pair over the simulator's
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
    # against itself (0) but another world of the same scene, right yet not this one: its
    # frames L-100..L differ from this world's by 4-31 levels RMS without any drift
    # (12 other worlds of each evaluation run, 2026-12-03)
    twin = {f"{r['scene']}_{'moving' if r['moving'] else 'idle'}": round(float(np.sqrt(np.mean(
        np.square(np.asarray(r["other_worlds_luma"]) - r["sim"][last, 2].mean())))), 2)
        for r in runs["runs"] if r.get("other_worlds_luma")}
    if twin:
        out["luma_drift_ground_truth"] = twin
        out["luma_drift_ground_truth_max"] = max(twin.values())
    return out


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
    # issue 15: a start from a picture (a simulator frame taken after some play)
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
