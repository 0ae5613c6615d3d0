"""Episode recorder: human-like random play of the simulator -> dataset shards on disk.

A shard is a folder of ``.npy`` arrays (memory-mappable, so training reads clips without loading
everything): ``frames (E, L, 128, 128, 3) uint8``, ``actions (E, L) int8`` (the action applied to
produce each frame), ``scene (E, L) int8`` (index into ``SCENE_NAMES``), ``prompt (E, L) int16``
(index into ``PROMPTS``: the scene prompt in force at that frame) and ``switch (E, L) bool`` (a
scene switch was requested at that frame).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from tqdm import tqdm

from worldstream.engine.worlds.actions import (
    IDLE,
    direction_to_action,
)
from worldstream.engine.worlds.scenes import SCENE_NAMES, SCENES
from worldstream.engine.worlds.simulator import WorldSimulator

#: every prompt of every scene, flattened; ``PROMPT_SCENE[i]`` is the scene index of PROMPTS[i]
PROMPTS: tuple[str, ...] = tuple(p for s in SCENE_NAMES for p in SCENES[s]["prompts"])
PROMPT_SCENE: tuple[int, ...] = tuple(
    i for i, s in enumerate(SCENE_NAMES) for _ in SCENES[s]["prompts"]
)


class HumanLikePolicy:
    """Sticky random key presses: holds an action for a geometric number of frames (mean
    ``mean_hold``), with pauses (idle), straight moves and diagonals; deterministic per seed."""

    def __init__(
        self,
        rng: np.random.Generator,
        mean_hold: float = 10.0,
        p_idle: float = 0.25,
        p_diagonal: float = 0.25,
    ):
        self.rng, self.mean_hold = rng, mean_hold
        self.p_idle, self.p_diagonal = p_idle, p_diagonal
        self.action, self.left = IDLE, 0

    def __call__(self) -> int:
        if self.left <= 0:
            r = self.rng.random()
            if r < self.p_idle:
                self.action = IDLE
            elif r < self.p_idle + self.p_diagonal:
                self.action = direction_to_action(
                    int(self.rng.choice([-1, 1])), int(self.rng.choice([-1, 1]))
                )
            else:
                dx, dy = [(1, 0), (-1, 0), (0, 1), (0, -1)][self.rng.integers(4)]
                self.action = direction_to_action(dx, dy)
            self.left = int(self.rng.geometric(1.0 / self.mean_hold))
        self.left -= 1
        return self.action


def record_episode(
    seed: int, length: int, switch_prob: float = 1 / 120, transition_frames: int | None = None
) -> dict[str, np.ndarray]:
    """One episode of ``length`` frames from world ``seed`` (start scene and prompt drawn
    from it); scene switches cross-fade over ``transition_frames`` frames (None: the
    simulator's default, 0: the switch frame is already the new scene)."""
    rng = np.random.default_rng([seed, 1])
    scene_idx = int(rng.integers(len(SCENE_NAMES)))
    sim = WorldSimulator(seed, SCENE_NAMES[scene_idx])
    policy = HumanLikePolicy(rng)
    prompt_idx = draw_prompt(rng, PROMPT_SCENE, scene_idx)
    out = episode_arrays(length, 128, np.int8)
    for i in range(length):
        if i > 0 and rng.random() < switch_prob:
            scene_idx = int((scene_idx + rng.integers(1, len(SCENE_NAMES))) % len(SCENE_NAMES))
            prompt_idx = draw_prompt(rng, PROMPT_SCENE, scene_idx)
            if transition_frames is None:
                sim.set_scene(SCENE_NAMES[scene_idx])
            else:
                sim.set_scene(SCENE_NAMES[scene_idx], transition_frames)
            out["switch"][i] = True
        action = policy()
        out["frames"][i] = sim.step(action)
        out["camera"][i] = sim.crop_origin()
        out["actions"][i], out["scene"][i], out["prompt"][i] = action, scene_idx, prompt_idx
    return out


def episode_arrays(length: int, size: int, action_dtype: type) -> dict[str, np.ndarray]:
    """The arrays of one episode of ``length`` frames of ``size`` px (the shard layout above;
    ``actions`` of ``action_dtype``), to be filled frame by frame. ``camera`` starts at zero:
    the top-left corner of the rendered crop, world px (x, y), the ground-truth camera path
    (a world whose camera never moves leaves it there)."""
    return {
        "frames": np.empty((length, size, size, 3), np.uint8),
        "actions": np.empty(length, action_dtype),
        "scene": np.empty(length, np.int8),
        "prompt": np.empty(length, np.int16),
        "switch": np.zeros(length, bool),
        "camera": np.zeros((length, 2), np.int64),
    }


def draw_prompt(rng: np.random.Generator, prompt_scene: tuple[int, ...], scene_idx: int) -> int:
    """A random prompt index of scene (or look) ``scene_idx``; ``prompt_scene[i]`` is the scene
    of prompt ``i``."""
    candidates = [i for i, s in enumerate(prompt_scene) if s == scene_idx]
    return int(rng.choice(candidates))


def save_shard(out: Path, episodes: list[dict[str, np.ndarray]]) -> None:
    """Stack the episodes' arrays into the shard folder ``out`` (one ``.npy`` a key)."""
    out.mkdir(parents=True, exist_ok=True)
    for key in episodes[0]:
        np.save(out / f"{key}.npy", np.stack([e[key] for e in episodes]))


def record_shard(
    out_dir: str | Path,
    seeds: list[int],
    length: int,
    switch_prob: float = 1 / 120,
    transition_frames: int | None = None,
) -> Path:
    """Record one episode per seed into the shard folder ``out_dir`` (tqdm progress)."""
    out = Path(out_dir)
    save_shard(out, [
        record_episode(s, length, switch_prob, transition_frames)
        for s in tqdm(seeds, desc=f"recording {out.name}", unit="episode")
    ])
    return out


def load_shard(path: str | Path, mmap: bool = True) -> dict[str, np.ndarray]:
    """Arrays of a shard folder, with ``seed`` (each episode's world seed) where the recorder
    saved it (the avatar's); raises FileNotFoundError naming a missing file."""
    path = Path(path)
    arrays = {}
    for key in ("frames", "actions", "scene", "prompt", "switch", "camera"):
        f = path / f"{key}.npy"
        if not f.exists():
            raise FileNotFoundError(f"dataset shard file missing: {f}")
        arrays[key] = np.load(f, mmap_mode="r" if mmap else None)
    if (path / "seed.npy").exists():
        arrays["seed"] = np.load(path / "seed.npy")
    return arrays
