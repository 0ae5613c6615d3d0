"""What a session's world can be saved to, loaded from, started from and played by, on the
engine thread (``Engine.call``) between two chunks: the input log export, save points, a start
from a picture, and a storyboard played live.

Every function validates what it can in the caller's thread first (a bad file changes
nothing), returns a ``concurrent.futures.Future`` the engine thread completes, and leaves the
session as it was when the work fails there (the future holds the exception). Replacing a
session's world (load, picture, story) frees its fork branches, keeps its stream counters
(frame indices go on) and starts a new input log.
"""

from __future__ import annotations

from collections import deque
from concurrent.futures import Future
from typing import Any

import numpy as np

from worldstream.engine.core.api import CapacityError, PromptCommand
from worldstream.engine.core.backend import CountsWorldFrames, PromptPrefetch
from worldstream.engine.core.inputlog import InputLog
from worldstream.engine.core.session import Session
from worldstream.engine.studio.picture import PictureError, fit_picture, png_base64
from worldstream.engine.studio.savepoint import (
    SAVEPOINT_FORMAT,
    SavepointError,
    decode,
    encode,
    file_sha256,
    model_version,
)
from worldstream.engine.studio.savestate import export_state, prepare_import
from worldstream.engine.studio.story import Storyboard, compile_story


def export_log(engine: Any, session_id: str) -> Future:
    """The session's input log as JSON-ready data (:mod:`engine.inputlog`), up to the chunks
    generated so far."""
    version = model_version(engine.backend)

    def run(s: Session) -> dict[str, Any]:
        return s.inputs.to_dict(model=engine.model_name, model_version=version,
                                chunk=s.chunk_index, frame=s.frame_index)

    return engine.call(session_id, run)


def save(engine: Any, session_id: str) -> Future:
    """The session's world as save-file bytes (:mod:`engine.savepoint`). The future fails
    with SavepointError for a model that cannot save its state."""
    version = model_version(engine.backend)

    def run(s: Session) -> bytes:
        arrays, scalars = export_state(engine.backend, s.state)
        meta = {"format": SAVEPOINT_FORMAT, "model": engine.model_name,
                "model_version": version, "session": _session_meta(s), "state": scalars}
        return encode(arrays, meta)

    return engine.call(session_id, run)


def _session_meta(s: Session) -> dict[str, Any]:
    # NOTE: the held keys as the backend's action id: a save point is loaded by the same model
    # version only; the model settings (memory_frames, attention) are the backend state's
    # (and the held keys and the mouse motion not yet in a chunk: a mouse model's input)
    return {"seed": s.seed, "prompt": s.prompt, "action": s.action,
            "frame_index": s.frame_index, "chunk_frames": s.chunk_frames, "steps": s.steps,
            "mode": s.mode, "fork_id": s.fork_id, "keys": sorted(s.keys),
            "pointer": list(s.pointer)}


def load(engine: Any, session_id: str, data: bytes) -> Future:
    """Replace the session's world with the save point ``data``. Raises SavepointError at once
    (nothing changes) for a file that is not a save point of this model and version, or is
    damaged; the future fails with CapacityError when the model's memory is full. The future's
    result: ``{"prompt", "seed", "world_frames", "frame_index"}`` (the saved world's age in
    frames, and the stream's frame index from which the loaded world shows)."""
    arrays, meta = decode(data, engine.backend)
    saved = meta["session"]
    if saved.chunk_frames not in engine.chunk_sizes:
        raise SavepointError(f"the save point streams chunks of {saved.chunk_frames} frames; "
                             f"this server {list(engine.chunk_sizes)}")
    sha = file_sha256(data)
    # NOTE: what may be slow (a game without emulator state replays its actions, up to
    # seconds) runs here, in the caller's thread: the engine thread only adopts the state
    make_state = prepare_import(engine.backend, arrays, meta["state"])
    del arrays

    def run(s: Session) -> dict[str, Any]:
        _replace_world(engine, s, make_state)
        s.seed, s.prompt, s.action = saved.seed, saved.prompt, saved.action
        s.keys, s.pointer = frozenset(saved.keys), (saved.pointer[0], saved.pointer[1])
        s.chunk_frames, s.mode, s.fork_id = saved.chunk_frames, saved.mode, saved.fork_id
        s.degrade.set_requested(steps=saved.steps)
        s.script = None
        s.inputs = _new_log(s, {"kind": "savepoint", "sha256": sha})
        frames = _world_frames(engine.backend, s.state)
        s.emit("info", loaded=sha[:12], prompt=s.prompt)
        return {"prompt": s.prompt, "seed": s.seed, "world_frames": frames,
                "frame_index": s.frame_index}

    return engine.call(session_id, run)


def _world_frames(backend: Any, state: Any) -> int | None:
    """The frames the loaded world has lived, where its backend counts them
    (``CountsWorldFrames``), else None."""
    return backend.world_frames(state) if isinstance(backend, CountsWorldFrames) else None


def start_from_picture(engine: Any, session_id: str, data: bytes) -> Future:
    """Replace the session's world with one whose first frame is the picture ``data`` (PNG or
    JPEG; centre-cropped and resized to the model's resolution), at the session's prompt and
    seed. Raises PictureError at once for a bad picture or a model that cannot start from
    one. The future's result: ``{"width", "height", "frame_index"}`` (the stream's frame index
    from which the new world shows)."""
    backend = engine.backend
    if not engine.info.starts_from_frames:
        raise PictureError(f"model {backend.name!r} cannot start from a picture")
    picture = fit_picture(data, backend.width, backend.height)
    frames = np.repeat(picture[None], backend.chunk_frames, axis=0)
    png = png_base64(picture)

    def run(s: Session) -> dict[str, Any]:
        _replace_world(engine, s, lambda: backend.new_state(s.prompt, s.seed,
                                                            start_frames=frames))
        s.action, s.script = engine.idle_action, None
        s.keys, s.pointer = frozenset(), (0.0, 0.0)
        s.inputs = _new_log(s, {"kind": "image", "png": png})
        s.emit("info", picture=True)
        return {"width": backend.width, "height": backend.height,
                "frame_index": s.frame_index}

    return engine.call(session_id, run)


def play_story(engine: Any, session_id: str, story: Storyboard) -> Future:
    """Play ``story`` live in the session from its next chunk: a fresh world of its first
    beat's prompt at its seed, then its events at their chunks (:class:`StoryPlayer`). The
    session emits ``story`` events (``beat``, ``beats``; ``done`` at the end). The future's
    result: ``{"beats", "chunks", "frames", "duration_s", "beat_chunks", "frame_index"}``."""
    if isinstance(engine.backend, PromptPrefetch):  # the prompts here, not on the engine thread
        for beat in story.beats:
            engine.backend.prepare_prompt(beat.prompt, beat.blend.text if beat.blend else None,
                    beat.blend.weight if beat.blend else 0.0)

    def run(s: Session) -> dict[str, Any]:
        events, beat_chunks, chunks = compile_story(story, fps=s.clock.fps,
                                                    chunk_frames=s.chunk_frames)
        first = story.beats[0].prompt
        _replace_world(engine, s, lambda: engine.backend.new_state(first, story.seed))
        s.seed, s.prompt = story.seed, first
        s.action = engine.idle_action
        s.keys, s.pointer = frozenset(), (0.0, 0.0)
        s.inputs = _new_log(s, {"kind": "prompt"})
        s.script = StoryPlayer(engine, events, beat_chunks, chunks, s.chunk_index)
        return {"beats": len(story.beats), "chunks": chunks, "frames": chunks * s.chunk_frames,
                "duration_s": story.duration_s, "beat_chunks": beat_chunks,
                "frame_index": s.frame_index}

    return engine.call(session_id, run)


class StoryPlayer:
    """A story's events due at the session's coming chunks (the engine calls
    :meth:`play_due` before generating each stream chunk of the session)."""

    def __init__(self, engine: Any, events: list[dict[str, Any]], beat_chunks: list[int],
                 chunks: int, chunk0: int):
        self.engine, self.chunk0, self.chunks = engine, chunk0, chunks
        self.events = deque(events)
        self.beats = deque(enumerate(beat_chunks))
        self.num_beats = len(beat_chunks)

    def play_due(self, s: Session) -> None:
        """Apply every event due by the session's next chunk; a refused event is reported as
        an error event and skipped. Ends the story (``s.script = None``) after its last
        chunk."""
        chunk = s.chunk_index - self.chunk0
        while self.beats and self.beats[0][1] <= chunk:
            beat, _ = self.beats.popleft()
            s.emit("story", beat=beat, beats=self.num_beats)
        while self.events and self.events[0]["chunk"] <= chunk:
            event = self.events.popleft()
            try:
                self._apply(s, event)
            except Exception as exc:  # e.g. the model's memory is full at a cut
                s.emit("error", code="story", field=event["kind"], message=str(exc))
        if chunk >= self.chunks:
            s.script = None
            s.emit("story", done=True, beats=self.num_beats)

    def _apply(self, s: Session, e: dict[str, Any]) -> None:
        if e["kind"] == "action":
            s.action = self.engine.backend.key_action(frozenset(e["keys"]))
            s.keys = frozenset(e["keys"])
            s.inputs.add("action", s.chunk_index, s.frame_index, keys=sorted(e["keys"]))
        elif e["kind"] == "prompt":
            command = PromptCommand(-1, 0.0, e["text"], e["blend_text"], e["blend_weight"])
            self.engine.commands.apply_prompt(s, command)
            s.inputs.command(command, s.chunk_index, s.frame_index, applied={})
        elif e["kind"] == "cut":
            _replace_world(self.engine, s,
                           lambda: self.engine.backend.new_state(e["prompt"], e["seed"]))
            s.prompt = e["prompt"]
            s.inputs.add("cut", s.chunk_index, s.frame_index, prompt=e["prompt"],
                         seed=e["seed"])


def _new_log(s: Session, start: dict[str, Any]) -> InputLog:
    return InputLog(start, seed=s.seed, prompt=s.prompt, chunk_frames=s.chunk_frames,
                    steps=s.steps, fps=s.clock.fps, chunk0=s.chunk_index, frame0=s.frame_index)


def _replace_world(engine: Any, s: Session, make_state) -> None:
    """Give ``s`` the new backend state ``make_state()`` in place of its world and fork
    branches (freed), within the engine's state budget. CapacityError (nothing changed) when
    the budget has no room for one more state; ``make_state``'s exception likewise."""
    with engine._lock:
        if not engine.scheduler.budget.can_reserve(1):
            raise CapacityError("the model's memory has no room for another world now")
        engine.scheduler.budget.account(s, 1)
    try:
        state = make_state()
    except BaseException:
        engine.commands.account(s, -1)
        raise
    engine.commands.free_branches(s)
    old, s.state = s.state, state
    if old is not None:
        engine.backend.free(old)
        engine.commands.account(s, -1)
