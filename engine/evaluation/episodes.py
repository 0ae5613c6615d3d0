"""Held-out episodes of the simulator (human-like play or given actions, prompt switches,
a chosen sub-pixel start) and the model's streams over them: started from the true first
chunk, free-running or teacher-forced, frame by frame."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tqdm import tqdm

from worldstream.engine.backends.builtin import BuiltinBackend
from worldstream.engine.core.backend import ChunkJob
from worldstream.engine.evaluation.metrics import psnr
from worldstream.engine.worlds.recorder import HumanLikePolicy
from worldstream.engine.worlds.scenes import SCENE_NAMES, SCENES
from worldstream.engine.worlds.simulator import WorldSimulator


@dataclass
class Episode:
    frames: np.ndarray  # (L, H, W, 3) uint8
    actions: list[int]  # (L,) action that produced each frame
    offsets: np.ndarray  # (L, 2) integer camera offset (x, y) of each frame
    scene: str
    prompt: str
    positions: np.ndarray | None = None  # (L, 2) float64 camera centre (x, y), world px


def start_stream(gen: BuiltinBackend, ep: Episode, seed: int, frames: int):
    """A stream of ``ep`` from its first ``frames`` true frames (noise ``seed``): the state,
    as ``gen.new_state`` returns it."""
    return gen.new_state(ep.prompt, seed, start_frames=ep.frames[:frames])


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
