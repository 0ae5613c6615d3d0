"""``play --world avatar --model sim``: the avatar simulator behind the ``WorldBackend``
contract, and the control layer every avatar backend shares.

The engine hands a backend one direction id per frame (from the held arrow keys, as for the
landscape); an avatar backend turns it into avatar action ids with the session's
:class:`~engine.worlds.avatar.actions.AvatarControls` (expression in force, speech queued), which
the engine sets through :meth:`AvatarControlsMixin.apply_controls` when an ``action`` message
carries ``expression`` or ``say``. No torch here: the simulator streams without it.
"""

from __future__ import annotations

import copy
from collections import deque
from collections.abc import Callable

import numpy as np

from worldstream.engine.backends.avatar.savestate import AvatarSaves
from worldstream.engine.backends.avatar.state import AvatarState
from worldstream.engine.backends.sim.backend import (
    check_job,
    pop_history,
    push_history,
    simulate_each,
)
from worldstream.engine.core.backend import BackendInfo, ChunkJob, ChunkResult
from worldstream.engine.core.limits import check_prompt, heavier_prompt
from worldstream.engine.worlds.actions import IDLE, keys_to_action
from worldstream.engine.worlds.avatar.actions import expression_index
from worldstream.engine.worlds.avatar.looks import LOOKS
from worldstream.engine.worlds.avatar.simulator import SIZE, AvatarSimulator
from worldstream.engine.worlds.avatar.visemes import check_say


def start_frames(prompt_or_look: str, seed: int, frames: int) -> np.ndarray:
    """``(frames, 128, 128, 3)`` uint8: the first frames of world ``seed`` in the prompt's look
    (a look name is taken as is), idle and neutral: how every avatar stream starts."""
    if prompt_or_look in LOOKS:
        look = prompt_or_look
    else:
        from worldstream.engine.models.builtin.text import look_for_prompt

        look = look_for_prompt(prompt_or_look)
    sim = AvatarSimulator(seed, look)
    return np.stack([sim.step(IDLE) for _ in range(frames)])


class AvatarControlsMixin:
    """The avatar's controls over any backend whose states are :class:`AvatarState`."""

    world = "avatar"

    def key_action(self, keys: frozenset[str]) -> int:
        """The head direction id (the landscape's 9 directions, ``engine.worlds.actions``) of
        held keys; the avatar action of each frame adds the controls to it. ValueError naming
        an unknown key."""
        return keys_to_action(keys)

    def apply_controls(self, state: AvatarState, expression: str | None = None,
                       say: str | None = None) -> None:
        """Hold ``expression`` and/or queue ``say`` from the next frame on. Both are checked
        before either is applied: ValueError (nothing changes) for an unknown expression or
        unsayable text."""
        if not isinstance(state, AvatarState) or state.freed:
            raise ValueError("state is freed or not an avatar state")
        if expression is not None:
            expression_index(expression)
        if say is not None:
            check_say(say)
        if expression is not None:
            state.controls.set_expression(expression)
        if say is not None:
            state.controls.say(say)

    def _actions(self, state: AvatarState, directions: list[int], keep: int) -> list[int]:
        """Avatar action ids of a chunk, remembering the controls before it (``keep`` kept)."""
        before = state.controls.copy()
        actions = state.controls.next_actions(directions)  # ValueError: nothing consumed
        state.history.append(before)
        while len(state.history) > keep:
            state.history.popleft()
        return actions

    @staticmethod
    def _rewind_controls(state: AvatarState, chunks: int) -> None:
        for _ in range(chunks - 1):
            state.history.pop()
        state.controls = state.history.pop()


class AvatarSimBackend(AvatarControlsMixin, AvatarSaves):
    """The avatar simulator as a backend (zero model cost). A prompt selects the nearest look
    (``look_for``, default ``engine.models.builtin.text.look_for_prompt``, loaded on first
    use); the job seed is ignored (the world is deterministic given its creation seed and
    actions). Same arguments as ``engine.backends.sim.backend.SimBackend``; the engine counts the
    states against ``max_states`` (a simulator holds no pooled memory)."""

    name = "avatar-sim"
    supported_chunk_frames = (1, 2, 3, 4)

    def info(self) -> BackendInfo:
        """The avatar, steered by the direction keys and its controls, any chunk size."""
        return BackendInfo(name=self.name, world="avatar", chunk_frames=self.chunk_frames,
                           supported_chunk_frames=self.supported_chunk_frames)

    def __init__(self, *, max_states: int = 32, default_fps: int = 20, chunk_frames: int = 2,
                 rewind_chunks: int = 16, look_for: Callable[[str], str] | None = None):
        for arg, value in (("max_states", max_states), ("default_fps", default_fps),
                           ("chunk_frames", chunk_frames), ("rewind_chunks", rewind_chunks)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{arg} must be a positive int, got {value!r}")
        self.width = self.height = SIZE
        self.max_states, self.default_fps = max_states, default_fps
        self.chunk_frames, self.rewind_chunks = chunk_frames, rewind_chunks
        if look_for is None:
            from worldstream.engine.models.builtin.text import look_for_prompt as look_for
        self._look_for = look_for

    def live(self, state: AvatarState) -> AvatarState:
        if not isinstance(state, AvatarState) or state.freed:
            raise ValueError("state is freed or not an avatar state")
        return state

    def new_state(self, prompt: str, seed: int) -> AvatarState:
        check_prompt(prompt)
        return AvatarState((AvatarSimulator(seed, self._look_for(prompt)), deque()))

    def prepare_prompt(self, text: str, blend_text: str | None = None,
                       blend_weight: float = 0.0) -> None:
        self._look_for(text)
        if blend_text is not None:
            self._look_for(blend_text)

    def set_prompt(self, state: AvatarState, text: str, blend_text: str | None = None,
                   blend_weight: float = 0.0) -> None:
        """Switch to the look of the heavier prompt; ValueError (nothing changes) for a bad
        prompt or weight."""
        self.live(state)
        state.inner[0].set_look(self._look_for(heavier_prompt(text, blend_text, blend_weight)))

    def fork(self, state: AvatarState) -> AvatarState:
        self.live(state)
        sim, sims = state.inner
        return AvatarState((copy.deepcopy(sim), deque(copy.deepcopy(s) for s in sims)),
                           state.controls.copy(), deque(c.copy() for c in state.history))

    def free(self, state: AvatarState) -> None:
        if isinstance(state, AvatarState) and not state.freed:
            state.freed = True
            state.history.clear()
            state.inner[1].clear()

    def rewind(self, state: AvatarState, chunks: int) -> None:
        """Back to the avatar (and its controls) of ``chunks`` chunks ago; ValueError beyond
        the history."""
        self.live(state)
        sims = state.inner[1]
        state.inner = (pop_history(sims, chunks), sims)
        self._rewind_controls(state, chunks)

    def _generate_one(self, job: ChunkJob) -> np.ndarray:
        state = self.live(job.state)
        check_job(job)
        actions = self._actions(state, job.actions, self.rewind_chunks)
        sim, sims = state.inner
        push_history(sims, copy.deepcopy(sim), self.rewind_chunks)
        return np.stack([sim.step(a) for a in actions])

    def generate(self, jobs: list[ChunkJob]) -> list[ChunkResult]:
        """Step each job's avatar once per frame; a bad job gets a result with ``error``;
        ``stages_ms`` holds the batch's ``simulate`` wall time."""
        return simulate_each(jobs, self._generate_one)
