"""The avatar evaluation's scripted episodes (expressions, head turns, speech: see
:mod:`engine.evaluation.avatar`), the model's free rollout of one and its teacher-forced head
turns."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from worldstream.engine.backends.builtin import BuiltinBackend
from worldstream.engine.core.backend import ChunkJob
from worldstream.engine.evaluation.episodes import Episode, start_stream, streamed_rollout
from worldstream.engine.worlds.actions import IDLE, NUM_ACTIONS
from worldstream.engine.worlds.avatar.actions import (
    EXPRESSIONS,
    NEUTRAL,
    AvatarControls,
    encode_action,
)
from worldstream.engine.worlds.avatar.looks import LOOKS
from worldstream.engine.worlds.avatar.recorder import WORDS
from worldstream.engine.worlds.avatar.simulator import AvatarSimulator

EXPRESSION_HOLD, TURN_HOLD = 32, 16
EXPRESSION_WINDOW = (10, 30)  # frames after the key: 0.5-1.5 s at 20 fps
TURN_WINDOW = (10, 16)


@dataclass
class ScriptedEpisode:
    """A scripted held-out episode: the simulator's ``frames (L, H, W, 3)`` uint8 and avatar
    ``actions``; ``expression_keys``/``turn_keys``: ``(frame, expression or direction id)``
    of each key; ``speech``: the frame range of the speech segment."""

    episode: Episode
    expression_keys: list[tuple[int, int]]
    turn_keys: list[tuple[int, int]]
    speech: range


def scripted_actions(rng: np.random.Generator) -> tuple[list[int], list, list, range]:
    """The three segments' avatar actions (module docstring) and where their keys are."""
    actions, expression_keys, turn_keys = [], [], []
    for e in rng.permutation(len(EXPRESSIONS)):
        expression_keys.append((len(actions), int(e)))
        actions += [encode_action(IDLE, int(e))] * EXPRESSION_HOLD
    for d in rng.permutation(NUM_ACTIONS):
        turn_keys.append((len(actions), int(d)))
        actions += [encode_action(int(d), NEUTRAL)] * TURN_HOLD
    controls = AvatarControls()
    for _ in range(2):
        controls.say(" ".join(rng.choice(WORDS, int(rng.integers(4, 8)))))
    start = len(actions)
    actions += controls.next_actions([IDLE] * len(controls.speech))
    return actions, expression_keys, turn_keys, range(start, len(actions))


def scripted_episode(seed: int, look: str) -> ScriptedEpisode:
    """The scripted episode of world ``seed`` in ``look`` (prompt: one of its paraphrases)."""
    rng = np.random.default_rng([seed, 5])
    actions, expression_keys, turn_keys, speech = scripted_actions(rng)
    sim = AvatarSimulator(seed, look)
    frames = np.stack([sim.step(a) for a in actions])
    prompts = LOOKS[look]["prompts"]
    prompt = prompts[int(rng.integers(len(prompts)))]
    ep = Episode(frames, actions, np.zeros((len(actions), 2), np.int64), look, prompt)
    return ScriptedEpisode(ep, expression_keys, turn_keys, speech)


def rollout(gen: BuiltinBackend, ep: Episode, steps: int, seed: int) -> np.ndarray:
    """The model's free rollout of ``ep``'s actions from its true first chunk: all frames, the
    first chunk included."""
    n = len(ep.actions) // gen.chunk_frames * gen.chunk_frames
    out = ep.frames[:n].copy()
    streamed_rollout(gen, ep, steps, seed, out.__setitem__)
    return out


def teacher_forced_turns(gen: BuiltinBackend, sep: ScriptedEpisode, steps: int,
                         seed: int) -> np.ndarray:
    """The episode's frames ``(L, H, W, 3)`` uint8 up to the end of the last turn window,
    where each frame of a ``TURN_WINDOW`` after a direction key is the model's, generated one
    chunk ahead of the simulator's frames before it (teacher forcing: the stream appends the
    true frames to its context and memory with ``BuiltinBackend.observe``, a fork generates
    the next frame and is freed); the simulator's frames elsewhere. Read beside the free
    rollout it tells where head turns fail: misses here too are the one-step prediction's,
    misses only in the free rollout compound from the model's own context (exposure bias).
    ValueError for a model of chunks of more than one frame."""
    if gen.chunk_frames != 1:
        raise ValueError(f"teacher-forced turns step one frame, the model's chunks hold "
                         f"{gen.chunk_frames}")
    ep = sep.episode
    want = {f + k for f, _ in sep.turn_keys for k in range(*TURN_WINDOW)}
    end = max(want) + 1
    out = ep.frames[:end].copy()
    state = start_stream(gen, ep, seed, 1)
    try:
        for c in range(1, end):
            if c in want:
                branch = gen.fork(state)
                try:
                    (res,) = gen.generate([ChunkJob(branch, [ep.actions[c]], steps)])
                    gen.finish()
                    if res.error:
                        raise res.error
                    out[c] = res.frames[0]
                finally:
                    gen.free(branch)
            gen.observe(state, ep.frames[c : c + 1], [ep.actions[c]])
    finally:
        gen.free(state)
    return out
