"""``--model sim``: a :class:`~engine.core.backend.WorldBackend` that streams the ground-truth
world.

Each state is a :class:`~engine.worlds.simulator.WorldSimulator` plus a bounded history of
snapshots (one per generated chunk) for rewind. A prompt selects the scene whose paraphrases
are nearest to it (``engine.models.builtin.text.scene_for_prompt``). Zero model cost: it calibrates
the latency lab and tests the streaming layer without a neural model.
"""

from __future__ import annotations

import copy
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np

from worldstream.engine.backends.sim.savestate import SimSaves
from worldstream.engine.backends.sim.state import SimState
from worldstream.engine.core.backend import BackendInfo, ChunkJob, ChunkResult
from worldstream.engine.core.limits import MAX_STEPS, check_prompt, heavier_prompt
from worldstream.engine.worlds.actions import action_to_direction, keys_to_action
from worldstream.engine.worlds.simulator import SIZE, WorldSimulator

# NOTE: the simulator's terrain caches are pure functions of (seed, scene, tile): forks and
# snapshots share them instead of copying megabytes per chunk. Any other attribute is copied.
_SHARED_CACHES = ("_tiles", "_colour")


def _copy_sim(sim: WorldSimulator) -> WorldSimulator:
    memo = {id(getattr(sim, name)): getattr(sim, name) for name in _SHARED_CACHES}
    return copy.deepcopy(sim, memo)


class SimBackend(SimSaves):
    """The built-in world simulator behind the ``WorldBackend`` contract.

    Args:
        max_states: live states (sessions + branches) the engine admits (its state budget;
            a simulator state costs no pooled memory, so the backend does not count them).
        default_fps: the rate sessions are streamed at by default.
        chunk_frames: frames per chunk by default.
        rewind_chunks: chunks of history kept for rewind.
        scene_for: prompt -> scene name (default ``engine.models.builtin.text.scene_for_prompt``,
        which loads
            the sentence-embedding model on first use).
    Frames are ``(SIZE, SIZE, 3)`` uint8 RGB. The job seed is ignored: the world is
    deterministic given its creation seed and the actions.
    """

    name = "sim"
    #: any chunk size the engine allows: the simulator steps frame by frame
    supported_chunk_frames = (1, 2, 3, 4)

    def info(self) -> BackendInfo:
        """A landscape steered by the direction keys, any chunk size."""
        return BackendInfo(name=self.name, world="landscape", chunk_frames=self.chunk_frames,
                           supported_chunk_frames=self.supported_chunk_frames)

    def world_frames(self, state: SimState) -> int:
        """The simulator's clock (``engine.core.backend.CountsWorldFrames``)."""
        return int(state.sim.t)

    def __init__(
        self,
        *,
        max_states: int = 32,
        default_fps: int = 20,
        chunk_frames: int = 2,
        rewind_chunks: int = 16,
        scene_for: Callable[[str], str] | None = None,
    ):
        for arg, value in (("max_states", max_states), ("default_fps", default_fps),
                           ("chunk_frames", chunk_frames), ("rewind_chunks", rewind_chunks)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{arg} must be a positive int, got {value!r}")
        self.width = self.height = SIZE
        self.max_states = max_states
        self.default_fps = default_fps
        self.chunk_frames = chunk_frames
        self.rewind_chunks = rewind_chunks
        if scene_for is None:
            from worldstream.engine.models.builtin.text import scene_for_prompt as scene_for
        self._scene_for = scene_for

    def key_action(self, keys: frozenset[str]) -> int:
        """The built-in world's action id (``engine.worlds.actions``) for held direction keys;
        ValueError naming an unknown key."""
        return keys_to_action(keys)

    def live(self, state: SimState) -> SimState:
        if not isinstance(state, SimState) or state.freed:
            raise ValueError("state is freed or not a SimBackend state")
        return state

    def new_state(self, prompt: str, seed: int) -> SimState:
        """A world of ``seed`` in the prompt's scene. ValueError for an empty/over-long
        prompt."""
        check_prompt(prompt)
        return SimState(WorldSimulator(seed=seed, scene=self._scene_for(prompt)))

    def prepare_prompt(self, text: str, blend_text: str | None = None,
                       blend_weight: float = 0.0) -> None:
        """Classify the prompts ahead (thread-safe; the engine calls it off its thread): warms
        the text-embedding cache that ``set_prompt`` reads."""
        self._scene_for(text)
        if blend_text is not None:
            self._scene_for(blend_text)

    def set_prompt(self, state: SimState, text: str, blend_text: str | None = None,
                   blend_weight: float = 0.0) -> None:
        """Cross-fade to the scene of the heavier prompt (``blend_text`` when its weight is
        above 0.5). ValueError (nothing changes) for a bad prompt or weight."""
        self.live(state)
        state.sim.set_scene(self._scene_for(heavier_prompt(text, blend_text, blend_weight)))

    def fork(self, state: SimState) -> SimState:
        """An independent copy (with its history)."""
        self.live(state)
        return SimState(_copy_sim(state.sim), deque(_copy_sim(s) for s in state.history))

    def free(self, state: SimState) -> None:
        if isinstance(state, SimState) and not state.freed:
            state.freed = True
            state.history.clear()

    def rewind(self, state: SimState, chunks: int) -> None:
        """Back to the world as it was ``chunks`` chunks ago; ValueError beyond the history."""
        self.live(state)
        state.sim = pop_history(state.history, chunks)

    def _generate_one(self, job: ChunkJob) -> np.ndarray:
        state = self.live(job.state)
        check_job(job)
        for action in job.actions:  # all checked before the world moves
            action_to_direction(action)
        push_history(state.history, _copy_sim(state.sim), self.rewind_chunks)
        return np.stack([state.sim.step(action) for action in job.actions])

    def generate(self, jobs: list[ChunkJob]) -> list[ChunkResult]:
        """Step each job's world once per action. A bad job gets a result with ``error``;
        ``stages_ms`` holds the batch's ``simulate`` wall time."""
        return simulate_each(jobs, self._generate_one)


def check_job(job: ChunkJob) -> None:
    """ValueError for a chunk job a simulator cannot run: steps outside [1, MAX_STEPS] or no
    frame."""
    if not 1 <= job.steps <= MAX_STEPS:
        raise ValueError(f"steps must be in [1, {MAX_STEPS}], got {job.steps}")
    if job.num_frames < 1:
        raise ValueError("a chunk needs at least one frame")


def push_history(history: deque, snapshot: Any, limit: int) -> None:
    """Keep ``snapshot`` (the world before a chunk) as the newest of at most ``limit``."""
    history.append(snapshot)
    while len(history) > limit:
        history.popleft()


def pop_history(history: deque, chunks: int) -> Any:
    """The world as it was ``chunks`` chunks ago, taken off ``history`` with every later one;
    ValueError (nothing changes) beyond the history."""
    if not isinstance(chunks, int) or not 1 <= chunks <= len(history):
        raise ValueError(f"can rewind 1..{len(history)} chunks, got {chunks!r}")
    for _ in range(chunks - 1):
        history.pop()
    return history.pop()


def simulate_each(jobs: list[ChunkJob],
                  step: Callable[[ChunkJob], np.ndarray]) -> list[ChunkResult]:
    """Results of ``step(job)`` (frames ``(F, H, W, 3)`` uint8) for each job of a simulator
    backend; a job whose step raises gets a result with ``error``, the others are unaffected.
    ``stages_ms``: the batch's ``simulate`` wall time."""
    t0 = time.perf_counter()
    outputs: list[np.ndarray | Exception] = []
    for job in jobs:
        try:
            outputs.append(step(job))
        except Exception as exc:  # isolate this job's failure
            outputs.append(exc)
    stages = {"simulate": (time.perf_counter() - t0) * 1e3}
    return [ChunkResult(None, dict(stages), out) if isinstance(out, Exception)
            else ChunkResult(out, dict(stages)) for out in outputs]
