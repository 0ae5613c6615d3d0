"""``play --world avatar``: the trained avatar world model (``assets/avatar``) as a backend.

The neural work is the built-in model's backend (``engine.backends.builtin.BuiltinBackend``:
paged KV cache, spatial memory, flow-matching denoise, cache fill) unchanged; this layer adds the
avatar's controls (:class:`~engine.backends.avatar.sim.AvatarControlsMixin`), turning
each frame's direction id into an avatar action id (direction, expression, viseme), and starts
every stream from simulator frames of the prompt's look. The camera never moves, so the spatial
memory holds the stream's first frame: the generated frames are residuals on that picture of
the character (an identity anchor).
"""

from __future__ import annotations

from collections import deque
from dataclasses import replace
from pathlib import Path

from worldstream.engine.backends.avatar.savestate import AvatarSaves
from worldstream.engine.backends.avatar.sim import AvatarControlsMixin, start_frames
from worldstream.engine.backends.avatar.state import AvatarState
from worldstream.engine.backends.builtin import (
    BuiltinBackend,
    BuiltinConfig,
    load_builtin_backend,
)
from worldstream.engine.backends.settings import load_settings
from worldstream.engine.core.backend import BackendInfo, ChunkJob, ChunkResult, backend_info
from worldstream.engine.core.limits import check_prompt
from worldstream.engine.models.builtin.text import look_for_prompt
from worldstream.engine.worlds.avatar.actions import NUM_ACTIONS, encode_action
from worldstream.engine.worlds.catalog import world


class AvatarModelBackend(AvatarControlsMixin, AvatarSaves):
    """A :class:`BuiltinBackend` whose model was trained on the avatar world, behind the
    ``WorldBackend`` contract; a backend whose config names no neutral action gets the avatar
    world's stream settings (``assets/avatar/stream_config.json``). ValueError when the
    model's action space is not the avatar's."""

    name = "avatar"

    def __init__(self, builtin: BuiltinBackend):
        if builtin.model.config.num_actions != NUM_ACTIONS:
            raise ValueError(f"an avatar model has {NUM_ACTIONS} action ids, this one "
                             f"{builtin.model.config.num_actions}")
        if builtin.config.neutral_action is None:
            builtin.config = replace(builtin.config,
                                     **load_settings(BuiltinConfig, world("avatar").assets))
        self.builtin = builtin
        self.width, self.height = builtin.width, builtin.height
        self.default_fps = 20
        self.max_states = builtin.max_states
        self.chunk_frames = builtin.chunk_frames
        self.rewind_chunks = builtin.rewind_chunks

    def info(self) -> BackendInfo:
        """The avatar over its built-in model (whose device, dtypes and chunk sizes it has);
        it starts from its looks, not from a picture."""
        return replace(backend_info(self.builtin), name=self.name, world="avatar",
                             starts_from_frames=False)

    def step_cost(self, steps: int) -> int:
        """The built-in backend's forwards a chunk (``PagedRunner.step_cost``)."""
        return self.builtin.step_cost(steps)

    def live(self, state: AvatarState) -> AvatarState:
        if not isinstance(state, AvatarState) or state.freed:
            raise ValueError("state is freed or not an avatar state")
        return state

    def new_state(self, prompt: str, seed: int) -> AvatarState:
        """A stream of the prompt's look for world ``seed``, from its first simulator frames;
        CapacityError when the pool is full, ValueError for a bad prompt."""
        check_prompt(prompt)
        look = look_for_prompt(prompt)
        frames = start_frames(look, seed, self.chunk_frames)
        # NOTE: the built-in backend prefills start frames with the landscape's IDLE id (4),
        # which is also the avatar's (idle head, neutral, silent): encode_action() == IDLE
        return AvatarState(self.builtin.new_state(prompt, seed, start_frames=frames))

    def prepare_prompt(self, text: str, blend_text: str | None = None,
                       blend_weight: float = 0.0) -> None:
        self.builtin.prepare_prompt(text, blend_text, blend_weight)
        look_for_prompt(text)

    def set_prompt(self, state: AvatarState, text: str, blend_text: str | None = None,
                   blend_weight: float = 0.0) -> None:
        """Switch to the look of ``text`` from the next chunk on, as a stream of that look
        starts: the new character's first simulator frame (world seed of the stream, at rest)
        is appended to the stream's context and becomes its memory picture (``observe``);
        expression and speech carry on. ValueError for a bad prompt or weight, nothing changed.

        NOTE: the generic prompt switch (a memory epoch per chunk for 3 chunks, the model
        restyling what it remembers) turned the character into a patchwork of colours in the
        page: the avatar's training data switch looks once in ~200 frames, too rarely for the
        model to learn to redraw a whole character from a stale picture."""
        inner = self.live(state).inner
        look = look_for_prompt(text)
        self.builtin.set_prompt(inner, text, blend_text, blend_weight)
        self.builtin.observe(inner, start_frames(look, inner.noise_seed, self.chunk_frames),
                         [encode_action()] * self.chunk_frames)
        inner.restyle_left = 0  # the memory picture is the new look's, current

    def fork(self, state: AvatarState) -> AvatarState:
        self.live(state)
        return AvatarState(self.builtin.fork(state.inner), state.controls.copy(),
                           deque(c.copy() for c in state.history))

    def free(self, state: AvatarState) -> None:
        if isinstance(state, AvatarState) and not state.freed:
            self.builtin.free(state.inner)
            state.freed = True
            state.history.clear()

    def rewind(self, state: AvatarState, chunks: int) -> None:
        """Back to the stream and controls of ``chunks`` chunks ago; ValueError (nothing
        changed) beyond the kept history."""
        self.live(state)
        if not isinstance(chunks, int) or not 1 <= chunks <= len(state.history):
            raise ValueError(f"can rewind 1..{len(state.history)} chunks, got {chunks!r}")
        self.builtin.rewind(state.inner, chunks)
        self._rewind_controls(state, chunks)

    def finish(self) -> dict[str, float]:
        return self.builtin.finish()

    def configure(self, state: AvatarState, **settings) -> None:
        """The built-in model's per-session settings (``memory_frames``, ``attention``)."""
        self.builtin.configure(self.live(state).inner, **settings)

    def check_saved(self, scalars, layout) -> None:
        """The wrapped built-in state's fields (``inner``) before any array is decoded."""
        from worldstream.engine.backends.builtin.savestate import check_builtin
        from worldstream.engine.studio.savepoint import SavepointError

        if not isinstance(scalars.get("inner"), dict):
            raise SavepointError("the save point's avatar state lacks its model's state")
        check_builtin(self.builtin, scalars["inner"], layout)

    def hash_renderer(self, h) -> None:
        """What draws the frames: the wrapped built-in model (its model version)."""
        from worldstream.engine.studio.savepoint import model_version

        h.update(model_version(self.builtin).encode())

    def generate(self, jobs: list[ChunkJob]) -> list[ChunkResult]:
        """One chunk per job, batched by the built-in backend; a job whose state or directions are
        bad gets a result with ``error`` and consumes no speech."""
        results: list[ChunkResult | None] = [None] * len(jobs)
        inner_jobs, where, before = [], [], []
        for i, job in enumerate(jobs):
            try:
                state = self.live(job.state)
                snapshot = state.controls.copy()
                actions = self._actions(state, job.actions, self.rewind_chunks + 1)
            except ValueError as err:
                results[i] = ChunkResult(None, error=err)
                continue
            inner_jobs.append(replace(job, state=state.inner, actions=actions))
            where.append(i)
            before.append(snapshot)
        for i, snapshot, res in zip(where, before, self.builtin.generate(inner_jobs) if inner_jobs
                                    else []):
            if res.error is not None:  # the chunk was not made: its speech is still to say
                jobs[i].state.controls = snapshot
                jobs[i].state.history.pop()
            results[i] = res
        return results


def load_avatar_backend(path: str | Path | None = None, **overrides) -> AvatarModelBackend:
    """The shipped avatar model (``assets/avatar``, or ``path``: ``transformer/``, ``vae/``,
    ``stream_config.json``) as a backend; ``overrides`` go to :class:`BuiltinConfig`.
    FileNotFoundError names a missing weights file, ValueError a bad setting."""
    path = Path(path) if path is not None else world("avatar").assets
    return AvatarModelBackend(load_builtin_backend(path, **overrides))
