"""A browser session of a game world (``play --env ID``) as recorded play: its input log replayed
through the env (:func:`engine.studio.replay.replay`), the stream's frames and the action
behind each written in the format of ``worldstream record`` (:mod:`engine.worlds.game.dataset`).

The dataset keeps the stream as the player saw it: each frame with the action taken after it
(-1 where an episode ended or the stream jumped). A rewind, an adopted future or a load starts
a new segment; each segment is written as shards of its own (a shard boundary is an episode
boundary when read back), so no transition is made up across a jump. Fork previews the player
did not adopt are not play: they are left out.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from worldstream.engine.core.registry import env_of, load_backend
from worldstream.engine.studio.replay import read_log, replay
from worldstream.engine.worlds.game import dataset


@dataclass
class _Segment:
    """Frames shown one after the other, the action taken after each (-1: none yet or an
    episode's end) and the episode seed of each."""

    frames: list[np.ndarray] = field(default_factory=list)
    actions: list[int] = field(default_factory=list)
    seeds: list[int] = field(default_factory=list)

    def add(self, frame: np.ndarray, seed: int) -> None:
        self.frames.append(frame)
        self.actions.append(-1)
        self.seeds.append(seed)


class _Tap:
    """Records every frame step of ``backend`` (``GameEnvBackend.step``) and splits the
    stream's steps into continuous segments."""

    def __init__(self, backend: Any):
        self.backend = backend
        self.steps: list[tuple] = []
        self.segments: list[_Segment] = []
        self._last: tuple | None = None  # where the previous stream step left its state
        self._states: list[Any] = []  # kept alive: their ids stay unique
        step = backend.step

        def tapped(state: Any, action: int):
            before = self._where(state)
            frame0, seed0 = state.game.frame.copy(), self._seed(state)
            frame, event = step(state, action)
            self.steps.append((before, frame0, seed0, action, frame.copy(), self._seed(state),
                               event is not None, self._where(state)))
            return frame, event

        backend.step = tapped

    def _seed(self, state: Any) -> int:
        from worldstream.engine.backends.game_env import episode_seed

        return episode_seed(state.seed, state.episode)

    def _where(self, state: Any) -> tuple[int, int, int]:
        if not any(s is state for s in self._states):
            self._states.append(state)
        return id(state), state.episode, len(state.game.actions)

    def on_frames(self, frames: np.ndarray) -> None:
        """A stream chunk of ``len(frames)`` frames: its steps are the newest (previews
        stepped other states before it)."""
        for before, frame0, seed0, action, frame, seed, reset, after in \
                self.steps[-len(frames):]:
            if before != self._last or not self.segments:
                self.segments.append(_Segment())
                self.segments[-1].add(frame0, seed0)
            segment = self.segments[-1]
            if not reset:  # a reset frame follows an episode's last frame: no action taken
                segment.actions[-1] = int(action)
            segment.add(frame, seed)
            self._last = after
        self.steps.clear()


def _shards(segments: list[_Segment], shard_frames: int):
    """``(frames, actions, episode)`` arrays of each shard: segments cut into pieces of at
    most ``shard_frames`` frames (a cut repeats its frame, so no transition is lost)."""
    for seg in segments:
        if len(seg.frames) < 2:
            continue
        start = 0
        while start < len(seg.frames) - 1:
            end = min(start + shard_frames, len(seg.frames))
            actions = np.asarray(seg.actions[start:end], np.int16)
            actions[-1] = -1
            yield (np.stack(seg.frames[start:end]), actions,
                   np.asarray(seg.seeds[start:end], np.int64))
            start = end - 1


def dataset_from_log(raw: bytes, out: str | Path, *, name: str = "input log",
                     keymap: Any = None, savepoint: bytes | None = None,
                     shard_frames: int = 2000, backend: Any = None) -> dict[str, Any]:
    """Write the play of a game world's input log ``raw`` into the empty or new folder
    ``out`` (``engine.worlds.game.dataset``); returns its meta dict. ``keymap``: the key map
    the session was played with (a file or dict; None: the derived one). ``savepoint``: the
    save file a log of a loaded session starts from. ``backend``: the game's backend as the
    session had it (default: the log's model with ``keymap``; frame size 64).

    Raises ValueError (one line; nothing written) for a malformed log, a log of another model
    than a game world's, a non-empty ``out``, a bad key map or env; ReplayError for a log the
    env cannot replay (another version of the game or key map)."""
    out = Path(out)
    if shard_frames < 2:
        raise ValueError(f"shard_frames must be >= 2, got {shard_frames}")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"{out} exists and is not an empty folder; choose another --out")
    log = read_log(raw, name)
    env = env_of(log.model)
    if env is None:
        raise ValueError(f"{name} was played with model {log.model!r}, not a game world: "
                         "record --from-log takes the log of a session of `play --env ID`")
    if not log.model.startswith("game-sim:"):  # a learned world's frames are not the game's
        raise ValueError(f"{name} was played in the learned world {log.model!r}, not the game "
                         "itself: record --from-log takes a session of `play --env ID "
                         "--model sim`")
    if backend is None:
        backend = load_backend(log.model, **({} if keymap is None else {"keymap": keymap}))
    tap = _Tap(backend)
    try:
        replay(backend, log, tap.on_frames, savepoint=savepoint)
    finally:
        backend.close()
    shards = list(_shards(tap.segments, shard_frames))
    if not shards:
        raise ValueError(f"{name} holds no played frames (a log of at least 1 chunk is needed)")
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    try:
        for i, (frames, actions, episode) in enumerate(shards):
            dataset.write_shard(partial / f"shard-{i:05d}.npz", frames, actions, episode)
        meta = {"env": env, "size": backend.size,
                "action_meanings": list(backend.action_meanings),
                "frames": int(sum(len(s[0]) for s in shards)), "shards": len(shards),
                "seed": log.seed, "policy": "log", "source": name}
        dataset.publish(partial, out, meta)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return meta
