"""Exact replay: play an input log (:mod:`engine.inputlog`) against a backend, headless and as
fast as it goes, reproducing the frames of the session that recorded it.

The replay makes the backend calls the engine made for that session, in the same order: the
start state, the commands at the chunk where the engine applied them, every stream chunk with
the actions and steps then in force, and every fork preview chunk with the seed the engine
derived for it. With the same model version, the same machine and the same number of torch
threads the frames are bit-identical (see the README for where floating point can differ).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from worldstream.engine.core.backend import (
    ChunkJob,
    Configurable,
    Finishes,
    WorldControls,
    backend_info,
)
from worldstream.engine.core.commands import derived_seed
from worldstream.engine.core.fields import ANY_KEY
from worldstream.engine.core.inputlog import ReplayLog, log_model, parse_log
from worldstream.engine.core.registry import takes_own_keys
from worldstream.engine.studio.picture import frame_from_png_base64
from worldstream.engine.studio.savepoint import decode, file_sha256, model_version
from worldstream.engine.studio.savestate import import_state


def read_log(raw: bytes | str, name: str = "input log") -> ReplayLog:
    """An input log validated for replay: the direction keys, or any key name for the log of
    a backend with keys of its own (a game world, Matrix-Game: the backend checks them at
    replay). ValueError (one line)."""
    keys = ANY_KEY if takes_own_keys(log_model(raw, name)) else None
    return parse_log(raw, name, keys)


class ReplayError(ValueError):
    """An input log that cannot be replayed here (another model or version, a missing save
    point, a failed chunk)."""


@dataclass
class _Branch:
    state: Any
    seed: int
    done: int = 0


class _Replay:
    def __init__(self, backend: Any, log: ReplayLog, savepoint: bytes | None):
        self.backend, self.log = backend, log
        self.action = backend.key_action(frozenset())  # the held keys' action id
        # a backend with an action space: the held keys and the mouse motion pending, as the
        # engine's session keeps them (engine.core.batch: the next stream chunk takes it)
        self.space = backend_info(backend).action_space
        self.keys: frozenset[str] = frozenset()
        self.pointer = (0.0, 0.0)
        self.steps, self.chunk_frames = log.steps, log.chunk_frames
        self.branches: list[_Branch] = []
        self.state = self._start(savepoint)

    def _start(self, savepoint: bytes | None) -> Any:
        log, backend = self.log, self.backend
        kind = log.start.kind
        if kind == "prompt":
            return backend.new_state(log.prompt, log.seed)
        if kind == "image":
            picture = frame_from_png_base64(log.start.png or "", backend.width,
                                            backend.height)
            frames = np.repeat(picture[None], backend.chunk_frames, axis=0)
            return backend.new_state(log.prompt, log.seed, start_frames=frames)
        if kind == "savepoint":
            if savepoint is None:
                raise ReplayError("this log starts from a save point: pass its file "
                                  f"(sha256 {log.start.sha256[:12]}...)")
            if file_sha256(savepoint) != log.start.sha256:
                raise ReplayError("the save point given is not the one this log starts from")
            arrays, meta = decode(savepoint, backend)
            saved = meta["session"]
            self.action = saved.action  # the keys held when it was saved
            self.keys, self.pointer = frozenset(saved.keys), tuple(saved.pointer)
            return import_state(backend, arrays, meta["state"])
        raise ReplayError("this log starts from another replica's recent frames (a failover): "
                          "it cannot be replayed")

    def _controls(self, stream: bool) -> list | None:
        if self.space is None:
            return None
        pointer = self.pointer if stream else (0.0, 0.0)
        if stream:
            self.pointer = (0.0, 0.0)
        return self.space.frame_controls(self.keys, pointer, self.chunk_frames)

    def _chunk(self, state: Any, steps: int, seed: int | None, stream: bool = True
               ) -> np.ndarray:
        (result,) = self.backend.generate([ChunkJob(state, [self.action] * self.chunk_frames,
                                                     steps, seed, self._controls(stream))])
        if isinstance(self.backend, Finishes):
            self.backend.finish()
        if result.error is not None:
            raise ReplayError(f"chunk generation failed: {result.error!r}")
        return result.frames

    def _free_branches(self, keep: int | None = None) -> None:
        for i, branch in enumerate(self.branches):
            if i != keep:
                self.backend.free(branch.state)
        self.branches = []

    def _hook(self, kind: type, name: str) -> Any:
        """The backend as ``kind`` (a Protocol of :mod:`engine.core.backend` with the method
        ``name``); ReplayError when it is not one (a log of another kind of world)."""
        if not isinstance(self.backend, kind):
            raise ReplayError(f"model {self.backend.name!r} has no {name}: the log's event "
                              "is of another kind of world")
        return self.backend

    def _branch(self, index: int) -> _Branch:
        if not 0 <= index < len(self.branches):
            raise ReplayError(f"the log takes branch {index} of a fork of "
                              f"{len(self.branches)} branches")
        return self.branches[index]

    def apply(self, e: Any) -> None:
        backend = self.backend
        match e.kind:
            case "action":
                self.action = backend.key_action(frozenset(e.keys))
                self.keys = frozenset(e.keys)
                if e.pointer is not None and self.space is not None and self.space.mouse:
                    self.pointer = (self.pointer[0] + e.pointer[0],
                                    self.pointer[1] + e.pointer[1])
            case "controls":
                self._hook(WorldControls, "apply_controls").apply_controls(
                    self.state, expression=e.expression, say=e.say)
            case "prompt":
                backend.set_prompt(self.state, e.text, e.blend_text, e.blend_weight)
            case "settings":
                self.chunk_frames, self.steps = e.chunk_frames, e.steps
                model = {k: v for k, v in (("memory_frames", e.memory_frames),
                                           ("attention", e.attention)) if v is not None}
                if model:
                    self._hook(Configurable, "configure").configure(self.state, **model)
            case "steps":
                self.steps = e.steps
            case "fork":
                self._free_branches()
                for i in range(e.k):
                    self.branches.append(_Branch(backend.fork(self.state),
                                                 derived_seed(self.log.seed, e.fork_id, i)))
            case "preview":
                branch = self._branch(e.branch)
                self._chunk(branch.state, e.steps, derived_seed(branch.seed, branch.done),
                            stream=False)
                branch.done += 1
            case "adopt":
                adopted = self._branch(e.branch).state
                self._free_branches(keep=e.branch)
                backend.free(self.state)
                self.state = adopted
            case "rewind":
                backend.rewind(self.state, e.chunks)
            case "cut":
                self._free_branches()
                backend.free(self.state)
                self.state = None
                self.state = backend.new_state(e.prompt, e.seed)

    def close(self) -> None:
        self._free_branches()
        if self.state is not None:
            self.backend.free(self.state)
            self.state = None


def replay(backend: Any, log: ReplayLog, on_frames: Callable[[np.ndarray], None], *,
           savepoint: bytes | None = None) -> dict[str, int]:
    """Replay ``log`` on ``backend``, calling ``on_frames(frames)`` with each stream chunk's
    ``(chunk_frames, H, W, 3)`` uint8 frames in order. ``savepoint``: the save file a log of a
    loaded session starts from. Returns ``{"chunks", "frames"}`` generated.

    Raises ReplayError for a log of another model or model version, a missing or different
    save point, or a chunk that fails; ValueError (from the backend) for an event it refuses.
    Every state made is freed, also on error."""
    if log.model != backend.name:
        raise ReplayError(f"the log was recorded with model {log.model!r}; this is "
                          f"{backend.name!r}")
    version = model_version(backend)
    if log.model_version != version:
        raise ReplayError(f"the log was recorded with another version of model "
                          f"{backend.name!r} ({log.model_version[:12]}, this one is "
                          f"{version[:12]})")
    run = _Replay(backend, log, savepoint)
    events = deque(log.events)
    frames = 0
    try:
        for chunk in range(log.chunks):
            while events and events[0].chunk <= chunk:
                run.apply(events.popleft())
            rgb = run._chunk(run.state, run.steps, None)
            frames += len(rgb)
            on_frames(rgb)
    finally:
        run.close()
    return {"chunks": log.chunks, "frames": frames}
