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
from pathlib import Path
from typing import Any

import numpy as np

from worldstream.engine.core.registry import env_of, load_backend, model_of_file
from worldstream.engine.studio.replay import read_log, replay
from worldstream.engine.worlds.game import dataset


class _Shards:
    """Segments of the stream written as shards while they are played, so memory holds at
    most one shard's frames however long the log (a long log once held every frame: ~9 MB/s).
    A segment is cut into pieces of at most ``shard_frames`` frames; a cut repeats its frame
    (so no transition is lost) and each piece's last action is -1."""

    def __init__(self, folder: Path, shard_frames: int):
        self.folder, self.shard_frames = folder, shard_frames
        self.shards = self.frames = 0
        self._frames: list[np.ndarray] = []
        self._actions: list[int] = []
        self._seeds: list[int] = []

    def segment(self, frame: np.ndarray, seed: int) -> None:
        """A new segment starting at ``frame`` (the stream jumped): the last one ends."""
        self.end()
        self.add(frame, seed)

    def add(self, frame: np.ndarray, seed: int, action_before: int | None = None) -> None:
        """``frame`` shown next; ``action_before``: the action taken after the frame before
        it (None: none, an episode's end)."""
        if action_before is not None:
            self._actions[-1] = int(action_before)
        self._frames.append(frame)
        self._actions.append(-1)
        self._seeds.append(seed)
        if len(self._frames) > self.shard_frames:  # a full piece, and the segment goes on
            self._write(self.shard_frames)
            keep = slice(self.shard_frames - 1, None)
            self._frames, self._actions = self._frames[keep], self._actions[keep]
            self._seeds = self._seeds[keep]

    def end(self) -> None:
        """The segment ends: its last piece is written (a segment of one frame is none)."""
        if len(self._frames) >= 2:
            self._write(len(self._frames))
        self._frames, self._actions, self._seeds = [], [], []

    def _write(self, n: int) -> None:
        actions = np.asarray(self._actions[:n], np.int16)
        actions[-1] = -1
        dataset.write_shard(self.folder / f"shard-{self.shards:05d}.npz",
                            np.stack(self._frames[:n]), actions,
                            np.asarray(self._seeds[:n], np.int64))
        self.shards += 1
        self.frames += n


class _Tap:
    """Records every frame step of ``backend`` (``GameEnvBackend.step``), splits the
    stream's steps into continuous segments and hands their frames to ``shards``."""

    def __init__(self, backend: Any, shards: _Shards):
        self.backend, self.shards = backend, shards
        self.steps: list[tuple] = []
        self._last: tuple | None = None  # where the previous stream step left its state
        self._serials = 0  # each state tapped gets a number (ids of freed states are reused)
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
        from worldstream.engine.backends.game.sim import episode_seed

        return episode_seed(state.seed, state.episode)

    def _where(self, state: Any) -> tuple[int, int, int]:
        serial = getattr(state, "_tap_serial", None)
        if serial is None:
            self._serials += 1
            serial = state._tap_serial = self._serials
        return serial, state.episode, len(state.game.actions)

    def on_frames(self, frames: np.ndarray) -> None:
        """A stream chunk of ``len(frames)`` frames: its steps are the newest (previews
        stepped other states before it)."""
        for before, frame0, seed0, action, frame, seed, reset, after in \
                self.steps[-len(frames):]:
            if before != self._last:
                self.shards.segment(frame0, seed0)
            # a reset frame follows an episode's last frame: no action taken
            self.shards.add(frame, seed, None if reset else int(action))
            self._last = after
        self.steps.clear()


def dataset_from_log(raw: bytes, out: str | Path, *, name: str = "input log",
                     keymap: Any = None, savepoint: bytes | None = None,
                     shard_frames: int = 2000, backend: Any = None,
                     model: str | None = None) -> dict[str, Any]:
    """Write the play of a game world's input log ``raw`` into the empty or new folder
    ``out`` (``engine.worlds.game.dataset``); returns its meta dict. ``keymap``: the key map
    the session was played with (a file or dict; None: the derived one). ``savepoint``: the
    save file a log of a loaded session starts from. ``backend``: the game's backend as the
    session had it (default: the log's model with ``keymap``; frame size 64). ``model``: the
    backend the command line named (``--env ID``): the log's must be the same; a log naming a
    ``module:factory`` game is replayed only then (a file never imports code).

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
        model_of_file(log.model, model, name)  # a string compared: nothing imported
        backend = load_backend(log.model, **({} if keymap is None else {"keymap": keymap}))
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    try:
        shards = _Shards(partial, shard_frames)
        tap = _Tap(backend, shards)
        try:
            replay(backend, log, tap.on_frames, savepoint=savepoint)
        finally:
            backend.close()
        shards.end()
        if not shards.shards:
            raise ValueError(f"{name} holds no played frames (a log of at least 1 chunk is "
                             "needed)")
        meta = {"env": env, "size": backend.size,
                "action_meanings": list(backend.action_meanings),
                "frames": shards.frames, "shards": shards.shards,
                "seed": log.seed, "policy": "log", "source": name}
        dataset.publish(partial, out, meta)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return meta
