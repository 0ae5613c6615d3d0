"""``--env ID --model sim`` (and ``--world pong|breakout --model sim``): a Gymnasium game itself
behind the :class:`~engine.core.backend.WorldBackend` contract, the ground truth of a game world.

Each state is a :class:`~engine.worlds.game.env.GameEnv` (deterministic: an episode is a
function of its seed and actions), the episode it plays and a bounded history of snapshots (one
per generated chunk) for rewind. One action id per frame steps the env once. A game has no text
prompt: the session's prompt is accepted and ignored, a prompt switch is refused. When an
episode ends (game over) the frame after its last one is the first frame of the next episode
(seed ``seed + episode``), and the chunk's result carries an ``episode`` event for the page.
Where that start is costly and copyable (crafter generates its world in pure Python, ~0.75 s
that would stall every session on the engine thread) it is made ahead, while the episode
plays, in a low-priority process, and restored at game over.
Held wire keys become action ids through the game's :class:`~engine.worlds.game.keymap.KeyMap`
(derived from the env's action meanings, or a JSON file); ``wire_keys`` and ``controls``
tell the transports and the page which keys the game has.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from worldstream.engine.backends.game.keys import GameKeys, load_keymap
from worldstream.engine.backends.game.savestate_sim import REPLAY_NICE, GameEnvSaves
from worldstream.engine.backends.sim.backend import check_job, pop_history, push_history
from worldstream.engine.core.backend import BackendInfo, ChunkJob, ChunkResult
from worldstream.engine.core.helpers import HelperError, HelperPool
from worldstream.engine.worlds.game.env import GameEnv, Snapshot

#: the registry's backend family of this file (a backend id is ``game-sim:ENV``)
FAMILY = "game-sim"
#: the longest an episode start made ahead may take, s (crafter's world generation: ~1 s)
STARTS_TIMEOUT_S = 30.0


def episode_seed(seed: int, episode: int) -> int:
    """The seed of episode ``episode`` (0 = the session's first) of a session of ``seed``."""
    return (seed + episode) % 2**31


@dataclass
class GameState:
    """One session's (or branch's) game: the env, the session's seed, the episode it plays
    (0-based) and, for rewind, ``(snapshot, episode)`` before each of its newest chunks
    (oldest first, at most ``rewind_chunks``)."""

    game: GameEnv
    seed: int
    episode: int = 0
    history: deque[tuple[Snapshot, int]] = field(default_factory=deque)
    freed: bool = False
    #: the next episode's start made ahead: (its seed, the future of its first snapshot)
    next_start: tuple[int, Future] | None = field(default=None, compare=False)

    def snapshot(self) -> tuple[Snapshot, int]:
        return self.game.snapshot(), self.episode


class GameEnvBackend(GameKeys, GameEnvSaves):
    """A Gymnasium game streamed as it is; its keys, controls and ``frame_version`` are
    :class:`~engine.backends.game.keys.GameKeys`.

    Args:
        env: a Gymnasium id (``ALE/Pong-v5``) or ``module:factory``.
        size: frames are ``(size, size, 3)`` uint8 (``engine.worlds.game.frames``).
        keymap: None (derived from the action meanings), a KeyMap, its JSON dict or a file.
        max_states: live states (sessions + branches) the engine admits.
        default_fps: sessions' rate by default (15: an Atari game at frame skip 4 in real time).
        chunk_frames: frames per chunk by default (any of 1-4 is generated).
        rewind_chunks: chunks of history kept for rewind.
        spare_envs: freed envs kept open for the next state or fork (making one costs ~0.1 s).
    Raises GameEnvError (a ValueError) for an env that cannot be a game world, KeyMapError (a
    ValueError) for a key map that does not fit it, ValueError for a bad argument.
    """

    world = "game"
    #: its frames are a game's palette pixels: sent scaled up with nearest neighbour
    pixel_art = True
    def info(self) -> BackendInfo:
        """A game: its own keys and the page's key map, palette pixels, any chunk size."""
        return BackendInfo(name=self.name, world=self.world, chunk_frames=self.chunk_frames,
                           supported_chunk_frames=self.supported_chunk_frames,
                           wire_keys=self.wire_keys, controls=self.controls,
                           num_actions=self.num_actions, pixel_art=self.pixel_art)

    #: any chunk size the engine allows: the env steps frame by frame
    supported_chunk_frames = (1, 2, 3, 4)

    def __init__(self, *, env: str, size: int = 64, keymap: Any = None, max_states: int = 16,
                 default_fps: int = 15, chunk_frames: int = 1, rewind_chunks: int = 16,
                 spare_envs: int = 4):
        self.check_sizes(max_states=max_states, default_fps=default_fps,
                         chunk_frames=chunk_frames, rewind_chunks=rewind_chunks)
        probe = GameEnv(env, size=size)  # GameEnvError for a bad env, before anything else
        try:
            self.keymap = load_keymap(keymap, env, probe.action_meanings)
        except BaseException:
            probe.close()
            raise
        self.env_id, self.size = env, size
        self.name = f"{FAMILY}:{env}"
        self.action_meanings = probe.action_meanings
        self.num_actions = probe.num_actions
        #: snapshots hold the emulator's state (ALE): a save point's must too
        self.native_state = probe.native_state
        #: snapshots hold a copy of the env (crafter): a save point's are made by replay
        self.copyable = probe.copyable
        #: the most actions an episode of the game takes (a save point holds no more)
        self.max_episode_actions = probe.max_episode_steps
        self.width = self.height = size
        self.max_states, self.default_fps = max_states, default_fps
        self.chunk_frames, self.rewind_chunks = chunk_frames, rewind_chunks
        self._spare_limit = max(0, int(spare_envs))
        self._spare: list[GameEnv] = [probe]
        # a save point's state is made off the engine thread (engine.studio.savestate)
        self._spare_lock = threading.Lock()
        #: episode starts made ahead in another process: a pure-Python env that copies
        #: (crafter's world generation), not an emulator whose reset is cheap (ALE)
        self.starts_ahead = probe.copyable and not probe.native_state
        # NOTE: supervised (engine.core.helpers): a dead process is replaced at the next
        # start and only the start it held is lost (made by a reset at game over); one
        # running past STARTS_TIMEOUT_S (a hung world generation) is killed and replaced
        self._starts: HelperPool | None = None

    # ------------------------------------------------------------ states
    def _env(self) -> GameEnv:
        with self._spare_lock:
            if self._spare:
                return self._spare.pop()
        return GameEnv(self.env_id, size=self.size)

    def live(self, state: GameState) -> GameState:
        if not isinstance(state, GameState) or state.freed:
            raise ValueError("state is freed or not a GameEnvBackend state")
        return state

    def new_state(self, prompt: str, seed: int) -> GameState:
        """The first frame of episode 0 of ``seed``; the prompt is ignored (a game has none).
        ValueError for a seed that is not a non-negative int."""
        if not isinstance(seed, int | np.integer) or isinstance(seed, bool) or seed < 0:
            raise ValueError(f"seed must be a non-negative int, got {seed!r}")
        game = self._env()
        try:
            game.reset(episode_seed(int(seed), 0))
        except BaseException:
            game.close()
            raise
        state = GameState(game, int(seed))
        self._start_ahead(state)
        return state

    def prepare_state(self, prompt: str, seed: int) -> Callable[[], GameState]:
        """:meth:`new_state` made in the caller's thread (``PreparesStates``): where episode
        starts are made ahead (crafter's world generation, ~1 s), the first episode's start
        comes from the starts process (waited for at most STARTS_TIMEOUT_S: HelperError past
        it) and is restored here; the engine thread only takes the state."""
        if not isinstance(seed, int | np.integer) or isinstance(seed, bool) or seed < 0:
            raise ValueError(f"seed must be a non-negative int, got {seed!r}")
        if not self.starts_ahead:
            return lambda: self.new_state(prompt, seed)
        future = self._starts_pool().submit(first_snapshot, self.env_id, self.size,
                                            episode_seed(int(seed), 0))
        if future is None:
            raise HelperError("the process making game worlds is busy; retry shortly")
        try:
            snap = future.result(STARTS_TIMEOUT_S)
        except TimeoutError:
            raise HelperError(f"the game world was not made within {STARTS_TIMEOUT_S:g} "
                              "s") from None
        except HelperError:
            raise
        except Exception as err:  # BrokenProcessPool: the starts process died
            raise HelperError(f"the process making game worlds failed ({type(err).__name__})"
                              ) from None
        return _Taken(self, self.state_from(int(seed), 0, snap, []))

    def _starts_pool(self) -> HelperPool:
        if self._starts is None:
            self._starts = HelperPool(1, nice=REPLAY_NICE, timeout_s=STARTS_TIMEOUT_S,
                                      max_pending=4 * self.max_states)
        return self._starts

    def state_from(self, seed: int, episode: int, snap: Snapshot,
                   history: list[tuple[Snapshot, int]]) -> GameState:
        """A state restored from a snapshot (a fork, a save point): a fresh env, exact."""
        game = self._env()
        try:
            game.restore(snap)
        except BaseException:
            game.close()
            raise
        state = GameState(game, seed, episode, deque(history))
        self._start_ahead(state)
        return state

    def fork(self, state: GameState) -> GameState:
        """An independent copy (its own env restored from a snapshot, with the history)."""
        self.live(state)
        return self.state_from(state.seed, state.episode, state.game.snapshot(),
                               list(state.history))

    def free(self, state: GameState) -> None:
        """Release the state's env (kept as a spare, or closed). Idempotent."""
        if isinstance(state, GameState) and not state.freed:
            state.freed = True
            state.history.clear()
            if state.next_start is not None:
                state.next_start[1].cancel()
                state.next_start = None
            with self._spare_lock:
                kept = len(self._spare) < self._spare_limit
                if kept:
                    self._spare.append(state.game)
            if not kept:
                state.game.close()

    def close(self) -> None:
        """Close the spare envs (states still live keep theirs) and the process making
        episode starts ahead."""
        with self._spare_lock:
            spare, self._spare = self._spare, []
        for game in spare:
            game.close()
        if self._starts is not None:
            self._starts.close()
            self._starts = None

    def _start_ahead(self, state: GameState) -> None:
        """Begin making the first snapshot of ``state``'s next episode in the starts process
        (where :attr:`starts_ahead`)."""
        if not self.starts_ahead:
            return
        seed = episode_seed(state.seed, state.episode + 1)
        try:
            future = self._starts_pool().submit(first_snapshot, self.env_id, self.size, seed)
        except HelperError:  # none can start now: the next episode starts by a reset
            future = None
        state.next_start = None if future is None else (seed, future)

    def _next_episode(self, state: GameState, seed: int) -> np.ndarray:
        """The first frame of episode ``seed`` in ``state``'s env: restored from the start
        made ahead when it is ready (the same frames as a reset: a copy of the env right
        after one), else a reset here."""
        ahead, state.next_start = state.next_start, None
        snap = None
        if ahead is not None:
            made, future = ahead
            if made == seed and future.done() and not future.cancelled() and \
                    future.exception() is None:
                snap = future.result()
            else:
                future.cancel()
        frame = state.game.restore(snap) if snap is not None else state.game.reset(seed)
        self._start_ahead(state)
        return frame

    def rewind(self, state: GameState, chunks: int) -> None:
        """Back to the game as it was ``chunks`` chunks ago; ValueError beyond the history."""
        self.live(state)
        snap, episode = pop_history(state.history, chunks)
        state.game.restore(snap)
        state.episode = episode

    # ------------------------------------------------------------ generation
    def step(self, state: GameState, action: int) -> tuple[np.ndarray, dict[str, Any] | None]:
        """One frame: the env stepped by ``action``, or, after a frame that ended the episode,
        the first frame of the next one (and its ``episode`` event payload)."""
        game = state.game
        if not game.done:
            return game.step(action), None
        state.episode += 1
        seed = episode_seed(state.seed, state.episode)
        frame = self._next_episode(state, seed)
        return frame, {"episode": state.episode, "seed": seed, "reason": "game over",
                       "message": f"game over: episode {state.episode + 1} begins"}

    def _generate_one(self, job: ChunkJob) -> tuple[np.ndarray, list]:
        state = self.live(job.state)
        check_job(job)
        self.check_actions(job.actions)  # all checked before the game moves
        push_history(state.history, state.snapshot(), self.rewind_chunks)
        frames, events = [], []
        for action in job.actions:
            frame, event = self.step(state, int(action))
            frames.append(frame)
            if event is not None:
                events.append(("episode", event))
        return np.stack(frames), events

    def generate(self, jobs: list[ChunkJob]) -> list[ChunkResult]:
        """Step each job's game once per action. A bad job (or an env that fails) gets a result
        with ``error``, the others are unaffected; ``stages_ms``: the batch's ``simulate``
        wall time; ``events``: an ``episode`` event where a game ended and the next began."""
        t0 = time.perf_counter()
        outputs: list[tuple[np.ndarray, list] | Exception] = []
        for job in jobs:
            try:
                outputs.append(self._generate_one(job))
            except Exception as exc:  # isolate this job's failure
                outputs.append(exc)
        stages = {"simulate": (time.perf_counter() - t0) * 1e3}
        return [ChunkResult(None, dict(stages), out) if isinstance(out, Exception)
                else ChunkResult(out[0], dict(stages), events=out[1]) for out in outputs]


def first_snapshot(env_id: str, size: int, seed: int) -> Snapshot:
    """The first snapshot of episode ``seed`` of ``env_id`` in a fresh env (run in the starts
    process; a copyable env's snapshot holds a copy of it)."""
    game = GameEnv(env_id, size=size)
    try:
        game.reset(seed)
        return game.snapshot()
    finally:
        game.close()


class _Taken:
    """A state made off the engine thread, handed over once; freed if never taken."""

    def __init__(self, backend: GameEnvBackend, state: GameState):
        self.backend, self.state = backend, state

    def __call__(self) -> GameState:
        state, self.state = self.state, None
        if state is None:
            raise ValueError("the state was already taken")
        return state

    def __del__(self) -> None:
        if self.state is not None:
            self.backend.free(self.state)


def load_game_backend(**kwargs: Any) -> GameEnvBackend:
    """The registry's factory (``load_backend("game-sim:ENV")`` passes ``env=ENV``)."""
    return GameEnvBackend(**kwargs)
