"""``--env ID --model-path DIR`` (``--model builtin``) and ``--world pong|breakout``: a game's
learned world model (:mod:`engine.models.game`) behind the
:class:`~engine.core.backend.WorldBackend` contract.

A state is the model's context: the last ``context`` frames as palette indices and the actions
taken after each but the last, plus a bounded history of contexts (one per generated chunk) for
rewind. A session starts from the real game: the env (ale-py is a dependency) is reset with
the session's seed (``episode_seed(seed, 0)``, as the game itself starts) and stepped
``context - 1`` times with its start action (FIRE where the game has one, the recorder's
opening, else NOOP), so the model continues from real frames. Those start frames are not
streamed: the first chunk's first frame is already the model's prediction after them and the
session's first action, so every streamed frame answers a key. Decoding is argmax over the
palette. A world with an outcome code draws each frame's outcome from uniforms that are a
function of the session's seed and the frame's index since the start (``frame_draws``), so
the same state, the same actions and the same index give the same frames: a replay, a fork
and a loaded save point are exact. A game
over does not exist in the learned world: it plays on. A game has no text prompt: the
session's prompt is accepted and ignored, a prompt switch is refused. Keys:
:class:`~engine.backends.game.keys.GameKeys` (the folder's ``keymap.json`` when it has one).
"""

from __future__ import annotations

import errno
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from worldstream.engine.backends.game.keys import GameKeys, load_keymap
from worldstream.engine.backends.game.savestate_world import GameWorldSaves
from worldstream.engine.backends.game.sim import episode_seed
from worldstream.engine.backends.sim.backend import check_job, pop_history, push_history
from worldstream.engine.core.backend import BackendInfo, ChunkJob, ChunkResult
from worldstream.engine.models.device import cpu_has_fast_bf16
from worldstream.engine.models.game.world import GameWorld, frame_draws, load_world
from worldstream.engine.worlds.game.env import GameEnv
from worldstream.engine.worlds.game.policy import START_WORDS

#: the registry's backend family of this file (a backend id is ``game-builtin:ENV``)
FAMILY = "game-builtin"
#: where the shipped learned worlds live (``assets/<world>``, a named game world's)
ASSETS = Path(__file__).resolve().parents[3] / "assets"


def shipped_folder(env: str) -> Path | None:
    """The shipped model folder of ``env`` (``ALE/Pong-v5`` -> ``assets/pong``), None for an
    env no named game world plays."""
    from worldstream.engine.core.registry import GAME_WORLDS

    name = next((w for w, e in GAME_WORLDS.items() if e == env), None)
    return None if name is None else ASSETS / name


def start_action(meanings: tuple[str, ...]) -> int:
    """The action a round starts with (``policy.START_WORDS``: FIRE, ...), else 0 (idle)."""
    upper = [m.upper() for m in meanings]
    return next((upper.index(w) for w in START_WORDS if w in upper), 0)


@dataclass
class WorldState:
    """One session's (or branch's) learned game. ``frames``: ``(context, S, S)`` uint8 palette
    indices, oldest first; ``actions``: ``(context - 1,)`` int64, the action taken after each
    frame but the last. Both are replaced, never written in place, so forks and the history
    share them. ``step``: frames generated since the start (the next frame's draw index).
    ``history``: ``(frames, actions, step)`` before each of the newest chunks."""

    seed: int
    frames: np.ndarray
    actions: np.ndarray
    history: deque[tuple[np.ndarray, np.ndarray, int]] = field(default_factory=deque)
    freed: bool = False
    step: int = 0


@dataclass
class _Rollout:
    """One job's chunk while it is generated; committed to the state only when it completes."""

    state: WorldState
    actions: list[int]
    frames: np.ndarray
    context_actions: np.ndarray
    step: int
    out: list[np.ndarray] = field(default_factory=list)
    error: Exception | None = None


class GameWorldBackend(GameKeys, GameWorldSaves):
    """A trained game world streamed through the engine.

    Args:
        env: the game's Gymnasium id or ``module:factory``; the folder must be trained on it.
        path: the model folder (``worldstream train --out DIR``); None: the shipped one of a
            named game world (``assets/pong``).
        keymap: None (the folder's ``keymap.json``, else derived from the action meanings), a
            KeyMap, its JSON dict or a file (``--keymap``).
        max_states: live states (sessions + branches) the engine admits.
        default_fps: sessions' rate by default (15: an Atari game at frame skip 4).
        chunk_frames: frames per chunk by default (any of 1-4 is generated).
        rewind_chunks: chunks of history kept for rewind.
        batch_invariant: predict each job's frame on its own, so frames never depend on
            batch-mates (exact replay); False: one ``next_frame`` call per frame position for
            every job of the batch (faster with several sessions, but a frame may then differ
            in the last float bit from the same frame predicted alone, and argmax can flip).
        bf16: bf16 autocast; None: on CUDA and on CPUs with native bf16 (``cpu_has_fast_bf16``).
        device: torch device of the network.
        cpu_threads: torch intra-op threads on a CPU (process-wide; None = leave as is).
    Raises ValueError for a bad argument, no ``path`` for an env without a shipped model, or a
    folder trained on another game (``WorldFolderError``) or with other actions;
    FileNotFoundError (the registry adds the hint) for a missing folder; GameEnvError for an
    env that cannot start; KeyMapError for a key map that does not fit the game.
    """

    world = "game"
    #: its frames are a game's palette pixels: sent scaled up with nearest neighbour
    pixel_art = True
    def info(self) -> BackendInfo:
        """A game: its own keys and the page's key map, palette pixels, any chunk size."""
        return BackendInfo(name=self.name, world=self.world, chunk_frames=self.chunk_frames,
                           supported_chunk_frames=self.supported_chunk_frames,
                           wire_keys=self.wire_keys, controls=self.controls,
                           num_actions=self.num_actions, pixel_art=self.pixel_art,
                           device=str(self.device))

    #: any chunk size the engine allows: frames are predicted one by one
    supported_chunk_frames = (1, 2, 3, 4)

    def __init__(self, *, env: str, path: str | Path | None = None, keymap: Any = None,
                 max_states: int = 16, default_fps: int = 15, chunk_frames: int = 1,
                 rewind_chunks: int = 16, batch_invariant: bool = True,
                 bf16: bool | None = None, device: str = "cpu", cpu_threads: int | None = 1):
        self.check_sizes(max_states=max_states, default_fps=default_fps,
                         chunk_frames=chunk_frames, rewind_chunks=rewind_chunks)
        folder = Path(path) if path is not None else shipped_folder(env)
        if folder is None:
            raise ValueError(f"--env {env} needs --model-path DIR: a folder trained with "
                             f"`worldstream train --env {env} --out DIR`")
        if not folder.exists():
            raise FileNotFoundError(errno.ENOENT, "no such model folder", str(folder))
        self.model: GameWorld = load_world(folder, env_id=env)  # WorldFolderError
        self.folder = folder
        self.device = torch.device(device)
        if self.device.type == "cpu" and cpu_threads:
            torch.set_num_threads(cpu_threads)
        self.model.unet.to(self.device)
        self.bf16 = (self.device.type == "cuda" or cpu_has_fast_bf16()) if bf16 is None \
            else bool(bf16)
        self.batch_invariant = bool(batch_invariant)
        self.env_id, self.size = env, self.model.size
        self.name = f"{FAMILY}:{env}"
        self.action_meanings = self.model.action_meanings
        self.num_actions = len(self.action_meanings)
        self.context = self.model.context
        self._game = GameEnv(env, size=self.size)  # GameEnvError: the start frames need it
        try:
            if self._game.action_meanings != self.action_meanings:
                raise ValueError(f"{folder} was trained on actions {list(self.action_meanings)}"
                                 f"; env {env!r} has {list(self._game.action_meanings)}")
            if keymap is None and (folder / "keymap.json").is_file():
                keymap = folder / "keymap.json"
            self.keymap = load_keymap(keymap, env, self.action_meanings)
        except BaseException:
            self._game.close()
            raise
        self._game_lock = threading.Lock()  # one env makes every state's start frames
        self.start_action = start_action(self.action_meanings)
        self.width = self.height = self.size
        self.max_states, self.default_fps = max_states, default_fps
        self.chunk_frames, self.rewind_chunks = chunk_frames, rewind_chunks

    def frame_version(self, **extra: Any) -> str:
        """``GameKeys.frame_version`` plus what this backend adds to the weights (which
        ``engine.studio.savepoint.model_version`` hashes itself): the start, the precision,
        the batching."""
        return super().frame_version(model=FAMILY, context=self.context, bf16=self.bf16,
                                     start_action=self.start_action,
                                     batch_invariant=self.batch_invariant, **extra)

    # ------------------------------------------------------------ states
    def live(self, state: WorldState) -> WorldState:
        if not isinstance(state, WorldState) or state.freed:
            raise ValueError("state is freed or not a GameWorldBackend state")
        return state

    def start_frames(self, seed: int) -> np.ndarray:
        """The real game's first ``context`` frames of a session of ``seed``: ``(context, S,
        S, 3)`` uint8 (reset, then the start action)."""
        with self._game_lock:
            frames = [self._game.reset(episode_seed(seed, 0))]
            for _ in range(self.context - 1):
                frames.append(self._game.step(self.start_action))
        return np.stack(frames)

    def new_state(self, prompt: str, seed: int) -> WorldState:
        """The model's context from the real game's start (see the module doc); the prompt is
        ignored (a game has none). ValueError for a seed that is not a non-negative int."""
        if not isinstance(seed, int | np.integer) or isinstance(seed, bool) or seed < 0:
            raise ValueError(f"seed must be a non-negative int, got {seed!r}")
        frames = self.model.palette.encode(self.start_frames(int(seed)))
        actions = np.full(self.context - 1, self.start_action, dtype=np.int64)
        return WorldState(int(seed), frames, actions)

    def state_from(self, seed: int, frames: np.ndarray, actions: np.ndarray,
                   history: list[tuple[np.ndarray, np.ndarray, int]],
                   step: int = 0) -> WorldState:
        """A state holding the given context (a save point's) at frame index ``step``,
        ``history`` ``(frames, actions, step)`` oldest first; ValueError naming what does not
        fit this model: shapes, palette indices, action ids, a history too long, a negative
        frame index."""
        if len(history) > self.rewind_chunks:
            raise ValueError(f"{len(history)} chunks of history; this backend keeps "
                             f"{self.rewind_chunks}")
        steps = [step, *(h[2] for h in history)]
        if any(not isinstance(t, int | np.integer) or t < 0 for t in steps):
            raise ValueError(f"frame indices are ints >= 0; got {steps[:3]!r:.80}")
        checked = [(*self._check_context(f, a), int(t))
                   for (f, a), t in zip([(frames, actions), *(h[:2] for h in history)], steps,
                                        strict=True)]
        return WorldState(int(seed), checked[0][0], checked[0][1], deque(checked[1:]),
                          step=checked[0][2])

    def _check_context(self, frames: np.ndarray,
                       actions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        frames, actions = np.asarray(frames), np.asarray(actions)
        c, s = self.context, self.size
        if frames.shape != (c, s, s) or not np.issubdtype(frames.dtype, np.integer) or \
                frames.min() < 0 or frames.max() >= len(self.model.palette):
            raise ValueError(f"a context is ({c}, {s}, {s}) palette indices below "
                             f"{len(self.model.palette)}; got {frames.shape} {frames.dtype}")
        if actions.shape != (c - 1,) or not np.issubdtype(actions.dtype, np.integer) or (
                actions.size and not 0 <= actions.min() <= actions.max() < self.num_actions):
            raise ValueError(f"context actions are ({c - 1},) ids in [0, {self.num_actions}); "
                             f"got {actions.shape} {actions.dtype}")
        return frames.astype(np.uint8), actions.astype(np.int64)

    def fork(self, state: WorldState) -> WorldState:
        """An independent copy with the history (the arrays are shared: never written)."""
        self.live(state)
        return WorldState(state.seed, state.frames, state.actions, deque(state.history),
                          step=state.step)

    def free(self, state: WorldState) -> None:
        """Release the state. Idempotent."""
        if isinstance(state, WorldState) and not state.freed:
            state.freed = True
            state.history.clear()

    def close(self) -> None:
        """Close the env that makes start frames (``new_state`` reopens none: call last)."""
        self._game.close()

    def rewind(self, state: WorldState, chunks: int) -> None:
        """Back to the context of ``chunks`` chunks ago; ValueError beyond the history."""
        self.live(state)
        state.frames, state.actions, state.step = pop_history(state.history, chunks)

    # ------------------------------------------------------------ generation
    def predict(self, frames: np.ndarray, actions: np.ndarray, seeds: np.ndarray,
                steps: np.ndarray) -> np.ndarray:
        """The next frame of each row: ``frames`` ``(B, context, S, S)`` palette indices,
        ``actions`` ``(B, context)`` (the last one leads to the predicted frame), each row's
        session seed and frame index ``(B,)`` (its outcome's draw) -> ``(B, S, S)`` uint8
        palette indices; no grad, bf16 autocast where ``self.bf16``."""
        x = torch.from_numpy(np.ascontiguousarray(frames, dtype=np.int64)).to(self.device)
        a = torch.from_numpy(np.ascontiguousarray(actions, dtype=np.int64)).to(self.device)
        u = (frame_draws(seeds, steps, self.model.draws).to(self.device)
             if self.model.samples else None)
        with torch.no_grad(), torch.autocast(self.device.type, dtype=torch.bfloat16,
                                             enabled=self.bf16):
            nxt = self.model.next_frame(x, a, u)
        return nxt.to("cpu").numpy().astype(np.uint8)

    def _rollout(self, job: ChunkJob) -> _Rollout:
        state = self.live(job.state)
        check_job(job)
        self.check_actions(job.actions)  # all checked before the world moves
        return _Rollout(state, [int(a) for a in job.actions], state.frames, state.actions,
                        state.step)

    def _step(self, rows: list[_Rollout], k: int) -> None:
        """Frame ``k`` of each row in one ``predict`` call; where that fails for several rows,
        each is tried alone, so one failing row fails only its own job."""
        try:
            nxt = self.predict(np.stack([r.frames for r in rows]),
                               np.stack([np.append(r.context_actions, r.actions[k])
                                         for r in rows]),
                               np.array([r.state.seed for r in rows], np.int64),
                               np.array([r.step for r in rows], np.int64))
        except Exception as exc:  # isolate: retry the rows one by one
            if len(rows) == 1:
                rows[0].error = exc
                return
            for row in rows:
                self._step([row], k)
            return
        for row, frame in zip(rows, nxt, strict=True):
            row.out.append(frame)
            row.frames = np.concatenate([row.frames[1:], frame[None]])
            row.context_actions = np.append(row.context_actions[1:], row.actions[k])
            row.step += 1

    def generate(self, jobs: list[ChunkJob]) -> list[ChunkResult]:
        """One chunk per job: frame ``k`` of every job that has one is predicted at once (one
        ``predict`` call per frame position; per job with ``batch_invariant``). A bad job, or
        one whose prediction fails, gets a result with ``error`` and keeps its state; the
        others are unaffected. ``stages_ms``: the batch's ``predict`` (network and argmax) and
        ``decode`` (palette to RGB) wall ms."""
        t0 = time.perf_counter()
        rollouts: list[_Rollout | Exception] = []
        for job in jobs:
            try:
                rollouts.append(self._rollout(job))
            except Exception as exc:  # isolate this job's failure
                rollouts.append(exc)
        live = [r for r in rollouts if isinstance(r, _Rollout)]
        for k in range(max((len(r.actions) for r in live), default=0)):
            rows = [r for r in live if k < len(r.actions) and r.error is None]
            for group in ([[r] for r in rows] if self.batch_invariant else [rows]):
                self._step(group, k)
        t1 = time.perf_counter()
        outputs: list[np.ndarray | Exception] = []
        for r in rollouts:
            if isinstance(r, Exception):
                outputs.append(r)
                continue
            if r.error is not None:
                outputs.append(r.error)
                continue
            state = r.state
            push_history(state.history, (state.frames, state.actions, state.step),
                         self.rewind_chunks)
            state.frames, state.actions, state.step = r.frames, r.context_actions, r.step
            outputs.append(self.model.palette.decode(np.stack(r.out)))
        stages = {"predict": (t1 - t0) * 1e3, "decode": (time.perf_counter() - t1) * 1e3}
        return [ChunkResult(None, dict(stages), out) if isinstance(out, Exception)
                else ChunkResult(out, dict(stages)) for out in outputs]


def load_game_world_backend(**kwargs: Any) -> GameWorldBackend:
    """The registry's factory (``load_backend("game-builtin:ENV")`` passes ``env=ENV`` and
    ``--model-path`` as ``path``)."""
    return GameWorldBackend(**kwargs)
