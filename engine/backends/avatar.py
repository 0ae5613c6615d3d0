"""``play --world avatar``: the trained avatar world model (``assets/avatar``) as a backend.

The neural work is the built-in model's backend (``engine.backends.builtin.BuiltinBackend``:
paged KV cache, spatial memory, flow-matching denoise, cache fill) unchanged; this layer adds the
avatar's controls (:class:`~engine.backends.avatar_sim.AvatarControlsMixin`), turning
each frame's direction id into an avatar action id (direction, expression, viseme), and starts
every stream from simulator frames of the prompt's look. The camera never moves, so the spatial
memory holds the stream's first frame: the generated frames are residuals on that picture of
the character (an identity anchor).
"""

from __future__ import annotations

from collections import deque
from dataclasses import replace
from pathlib import Path

from worldstream.engine.backends.avatar_sim import AvatarControlsMixin, AvatarState, start_frames
from worldstream.engine.backends.builtin import BuiltinBackend, BuiltinConfig
from worldstream.engine.core.backend import ChunkJob, ChunkResult
from worldstream.engine.core.limits import check_prompt
from worldstream.engine.models.builtin.loading import load_autoencoder, load_world_model
from worldstream.engine.models.builtin.text import look_for_prompt
from worldstream.engine.worlds.avatar.actions import NUM_ACTIONS, encode_action
from worldstream.engine.worlds.avatar.simulator import backdrop
from worldstream.engine.worlds.catalog import world

#: the avatar world's action guidance (``BuiltinConfig.action_guidance``) on expression and
#: speech, against a neutral expression and silence with the head direction kept as asked
#: (``kept_factors``: guiding the direction too broke turned heads apart, full evaluation
#: head-turn accuracy 0.667 -> 0.108); see assets/avatar/MODEL_CARD.md for the measurements
ACTION_GUIDANCE = 2.0
#: the avatar world's ``BuiltinConfig.residual_deadzone`` (levels): two-step samples left a
#: mottled texture on the still background and face from the first generated frame; dropping
#: changes under 16 levels took head turns read right from 0.55 to 0.78 on the first three
#: scripted evaluation episodes (6: 0.71, 10: 0.76, 24: 0.67), expressions unchanged (0.94)
RESIDUAL_DEADZONE = 16.0
#: the avatar world's ``BuiltinConfig.residual_gate`` and ``window_pose_tolerance`` (2
#: pose steps of 1/32): together they left fewer turned heads of the scripted held-out
#: episodes with a ghost of the head at rest (by eye 12-14 of 27 frames +12 after a key,
#: against 23), head turns read at 0.6 of the gate 0.651 -> 0.775 (at the full gate 0.910 ->
#: 0.907), expressions unchanged (0.967); assets/avatar/MODEL_CARD.md
RESIDUAL_GATE = (32.0, 80.0)
WINDOW_POSE_TOLERANCE = 2 / 32


def avatar_settings(**kwargs) -> dict:
    """:class:`BuiltinConfig` settings for the avatar world: its neutral action (no key, neutral
    expression, silence), the factor kept as asked (the head direction),
    :data:`ACTION_GUIDANCE`, :data:`RESIDUAL_DEADZONE`, :data:`RESIDUAL_GATE`,
    :data:`WINDOW_POSE_TOLERANCE`, fresh noise every chunk and no
    steady prompt guidance (the look is held by the memory picture; the landscape's
    ``steady_guidance_sigma`` was measured on new ground only) and no first step from memory
    (a turn's first step must leave the head at rest: ``BuiltinConfig``) and no detail limit
    or colour anchor on generated ground (the camera never moves: there is none), unless
    ``kwargs`` name them.

    NOTE: no world-anchored noise here: the avatar's camera never moves, so the field would
    give every frame the same noise, which pulls each sample towards the last one where a head
    turn must redraw the head in place (first three scripted episodes, 2 steps: head turns
    0.43 with it against 0.72 without)."""
    return {"neutral_action": encode_action(), "kept_factors": (0,),
            "action_guidance": ACTION_GUIDANCE, "residual_deadzone": RESIDUAL_DEADZONE,
            "residual_gate": RESIDUAL_GATE, "window_pose_tolerance": WINDOW_POSE_TOLERANCE,
            "world_noise": False, "steady_guidance_sigma": None,
            "first_step_from_memory": None, "refining_detail_cap": None,
            "refining_detail_shading": False,
            "colour_anchor": None, **kwargs}


class AvatarModelBackend(AvatarControlsMixin):
    """A :class:`BuiltinBackend` whose model was trained on the avatar world, behind the
    ``WorldBackend`` contract; a generator whose config names no neutral action gets
    :func:`avatar_settings`. ValueError when the model's action space is not the avatar's."""

    name = "avatar"

    def __init__(self, generator: BuiltinBackend):
        if generator.model.config.num_actions != NUM_ACTIONS:
            raise ValueError(f"an avatar model has {NUM_ACTIONS} action ids, this one "
                             f"{generator.model.config.num_actions}")
        if generator.config.neutral_action is None:
            generator.config = replace(generator.config, **avatar_settings())
        self.gen = generator
        self.width, self.height = generator.width, generator.height
        self.default_fps = 20
        self.max_states = generator.max_states
        self.chunk_frames = generator.chunk_frames
        self.rewind_chunks = generator.rewind_chunks

    def step_cost(self, steps: int) -> int:
        """The generator's forwards a chunk (``PagedRunner.step_cost``)."""
        return self.gen.step_cost(steps)

    def _live(self, state: AvatarState) -> AvatarState:
        if not isinstance(state, AvatarState) or state.freed:
            raise ValueError("state is freed or not an avatar state")
        return state

    def new_state(self, prompt: str, seed: int) -> AvatarState:
        """A stream of the prompt's look for world ``seed``, from its first simulator frames,
        with the look's background plate as its backdrop (``BuiltinBackend.set_backdrop``);
        CapacityError when the pool is full, ValueError for a bad prompt."""
        check_prompt(prompt)
        look = look_for_prompt(prompt)
        frames = start_frames(look, seed, self.chunk_frames)
        # NOTE: the generator prefills start frames with the landscape's IDLE id (4), which is
        # also the avatar's (idle head, neutral, silent): encode_action() == IDLE
        inner = self.gen.new_state(prompt, seed, start_frames=frames)
        self.gen.set_backdrop(inner, backdrop(look, seed))
        return AvatarState(inner)

    def prepare_prompt(self, text: str, blend_text: str | None = None,
                       blend_weight: float = 0.0) -> None:
        self.gen.prepare_prompt(text, blend_text, blend_weight)
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
        inner = self._live(state).inner
        look = look_for_prompt(text)
        self.gen.set_prompt(inner, text, blend_text, blend_weight)
        self.gen.observe(inner, start_frames(look, inner.noise_seed, self.chunk_frames),
                         [encode_action()] * self.chunk_frames)
        self.gen.set_backdrop(inner, backdrop(look, inner.noise_seed))
        inner.restyle_left = 0  # the memory picture is the new look's, current

    def fork(self, state: AvatarState) -> AvatarState:
        self._live(state)
        return AvatarState(self.gen.fork(state.inner), state.controls.copy(),
                           deque(c.copy() for c in state.history))

    def free(self, state: AvatarState) -> None:
        if isinstance(state, AvatarState) and not state.freed:
            self.gen.free(state.inner)
            state.freed = True
            state.history.clear()

    def rewind(self, state: AvatarState, chunks: int) -> None:
        """Back to the stream and controls of ``chunks`` chunks ago; ValueError (nothing
        changed) beyond the kept history."""
        self._live(state)
        if not isinstance(chunks, int) or not 1 <= chunks <= len(state.history):
            raise ValueError(f"can rewind 1..{len(state.history)} chunks, got {chunks!r}")
        self.gen.rewind(state.inner, chunks)
        self._rewind_controls(state, chunks)

    def finish(self) -> dict[str, float]:
        return self.gen.finish()

    def configure(self, state: AvatarState, **settings) -> None:
        """The built-in model's per-session settings (``memory_frames``, ``attention``)."""
        self.gen.configure(self._live(state).inner, **settings)

    def generate(self, jobs: list[ChunkJob]) -> list[ChunkResult]:
        """One chunk per job, batched by the generator; a job whose state or directions are
        bad gets a result with ``error`` and consumes no speech."""
        results: list[ChunkResult | None] = [None] * len(jobs)
        inner_jobs, where, before = [], [], []
        for i, job in enumerate(jobs):
            try:
                state = self._live(job.state)
                snapshot = state.controls.copy()
                actions = self._actions(state, job.actions, self.rewind_chunks + 1)
            except ValueError as err:
                results[i] = ChunkResult(None, error=err)
                continue
            inner_jobs.append(replace(job, state=state.inner, actions=actions))
            where.append(i)
            before.append(snapshot)
        for i, snapshot, res in zip(where, before, self.gen.generate(inner_jobs) if inner_jobs
                                    else []):
            if res.error is not None:  # the chunk was not made: its speech is still to say
                jobs[i].state.controls = snapshot
                jobs[i].state.history.pop()
            results[i] = res
        return results


def load_avatar_backend(path: str | Path | None = None, **kwargs) -> AvatarModelBackend:
    """The shipped avatar model (``assets/avatar/{transformer,vae}``, or ``path``) as a
    backend; ``kwargs`` go to :class:`BuiltinConfig`. FileNotFoundError names a missing
    weights file."""
    path = Path(path) if path is not None else world("avatar").assets
    return AvatarModelBackend(BuiltinBackend(load_world_model(path / "transformer"),
                                             load_autoencoder(path / "vae"),
                                             BuiltinConfig(**avatar_settings(**kwargs))))
