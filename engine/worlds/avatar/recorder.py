"""Episode recorder of the avatar world: scripted human-like puppeteering -> dataset shards in
the landscape recorder's layout (``engine.worlds.recorder.load_shard`` reads them).

A shard folder holds ``frames (E, L, 128, 128, 3) uint8``, ``actions (E, L) int16`` (avatar
action ids, ``avatar.actions``), ``scene (E, L) int8`` (look index into ``LOOK_NAMES``),
``prompt (E, L) int16`` (index into ``looks.PROMPTS``), ``switch (E, L) bool`` (a look switch
at that frame), ``camera (E, L, 2) int64`` (all zero: the avatar's camera never moves; the
world model's camera dynamics learn to stand still) and ``seed (E,) int64`` (each episode's
world seed: with ``scene`` it names the background plate behind every frame,
``simulator.scene_backdrop``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from tqdm import tqdm

from worldstream.engine.worlds.actions import IDLE, direction_to_action
from worldstream.engine.worlds.avatar.actions import NUM_EXPRESSIONS, AvatarControls
from worldstream.engine.worlds.avatar.looks import LOOK_NAMES, PROMPT_LOOK
from worldstream.engine.worlds.avatar.simulator import SIZE, AvatarSimulator
from worldstream.engine.worlds.recorder import draw_prompt, episode_arrays, save_shard

WORDS = (
    "hello there how are you today I am fine thank you the weather is lovely let us talk about "
    "the world model it streams video in real time from a small computer we can smile or frown "
    "and look around please say something nice my name is avatar what a wonderful morning good "
    "bye see you soon maybe tomorrow open the door look at the moon"
).split()


class PuppeteerPolicy:
    """Sticky random controls, deterministic per ``rng``: head directions held for a geometric
    number of frames (mean ``mean_hold``, centre half the time), an expression change every
    ~``mean_expression`` frames, and sentences of 2-7 words every ~``mean_silence`` frames."""

    def __init__(self, rng: np.random.Generator, mean_hold: float = 14.0,
                 mean_expression: float = 40.0, mean_silence: float = 30.0):
        self.rng = rng
        self.mean_hold, self.mean_expression, self.mean_silence = (
            mean_hold, mean_expression, mean_silence)
        self.controls = AvatarControls()
        self.direction, self.hold = IDLE, 0

    def __call__(self) -> int:
        rng = self.rng
        if self.hold <= 0:
            if rng.random() < 0.5:
                self.direction = IDLE
            else:
                dx, dy = int(rng.integers(-1, 2)), int(rng.integers(-1, 2))
                self.direction = direction_to_action(dx, dy)
            self.hold = int(rng.geometric(1.0 / self.mean_hold))
        self.hold -= 1
        if rng.random() < 1.0 / self.mean_expression:
            self.controls.expression = int(rng.integers(NUM_EXPRESSIONS))
        if not self.controls.speech and rng.random() < 1.0 / self.mean_silence:
            words = rng.choice(WORDS, int(rng.integers(2, 8)))
            self.controls.say(" ".join(words), rate=float(rng.uniform(0.8, 1.25)))
        return self.controls.next_actions([self.direction])[0]


def record_episode(seed: int, length: int, switch_prob: float = 1 / 200,
                   look: str | None = None) -> dict[str, np.ndarray]:
    """One episode of ``length`` frames of world ``seed`` (its look and prompt drawn from the
    seed unless ``look`` is given); the look switches with probability ``switch_prob`` a
    frame."""
    rng = np.random.default_rng([seed, 1])
    look_idx = int(rng.integers(len(LOOK_NAMES))) if look is None else LOOK_NAMES.index(look)
    sim = AvatarSimulator(seed, LOOK_NAMES[look_idx])
    policy = PuppeteerPolicy(rng)
    prompt_idx = draw_prompt(rng, PROMPT_LOOK, look_idx)
    out = episode_arrays(length, SIZE, np.int16)
    for i in range(length):
        if i > 0 and rng.random() < switch_prob:
            look_idx = int((look_idx + rng.integers(1, len(LOOK_NAMES))) % len(LOOK_NAMES))
            prompt_idx = draw_prompt(rng, PROMPT_LOOK, look_idx)
            sim.set_look(LOOK_NAMES[look_idx])
            out["switch"][i] = True
        action = policy()
        out["frames"][i] = sim.step(action)
        out["actions"][i], out["scene"][i], out["prompt"][i] = action, look_idx, prompt_idx
    return out


def record_shard(out_dir: str | Path, seeds: list[int], length: int,
                 switch_prob: float = 1 / 200) -> Path:
    """Record one episode per seed into the shard folder ``out_dir`` (tqdm progress)."""
    out = Path(out_dir)
    save_shard(out, [record_episode(s, length, switch_prob)
                     for s in tqdm(seeds, desc=f"recording {out.name}", unit="episode")])
    np.save(out / "seed.npy", np.asarray(seeds, np.int64))
    return out

