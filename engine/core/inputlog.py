"""A session's input log: everything that decided its frames, in the order the engine thread
applied it, so that :mod:`engine.replay` can reproduce the frames exactly.

Recorded: the start (prompt and seed, a picture, or a save point), every applied action
(its held keys, and the mouse motion it added where the model takes mouse input),
world control (the avatar's expression and speech), prompt, settings change, fork, adopt and
rewind, and what the engine itself decided that
changes frames: the denoising steps of the stream when degradation changes them, and each
fork preview chunk (branches are generated in the slack between stream chunks, with the
actions held at that moment). Each event carries ``chunk`` and ``frame``: how many stream
chunks and frames the log's session had generated when the event was applied (counted from
the log's start), so it takes effect from stream chunk ``chunk`` on.

The JSON form (``LOG_FORMAT``) is documented in ``streaming/PROTOCOL_EXTENSIONS.md``; its
schema for reading is :class:`ReplayLog`. No torch here.
"""

from __future__ import annotations

import threading
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from worldstream.engine.core import fields
from worldstream.engine.core.api import (
    ActionCommand,
    AdoptCommand,
    ForkCommand,
    PromptCommand,
    RewindCommand,
    SettingsCommand,
)
from worldstream.engine.core.limits import (
    MAX_ATTENTION_CHARS,
    MAX_SEED,
    check_json,
)
from worldstream.engine.core.reader import validate

LOG_FORMAT = "worldstream-input-log/1"
#: the largest input log read (a 60 s session with a key change every frame is ~100 KB)
MAX_LOG_BYTES = 16 * 2**20
#: events a live log keeps: ~1 hour at the protocol's 30 messages/s (~8 MB); past it the log
#: stops and cannot be exported (a replay needs every event)
MAX_LOG_EVENTS = 100_000

class InputLog:
    """The live log of one session (engine thread appends, any thread snapshots).

    Args:
        start: how the world started: ``{"kind": "prompt"}`` (``new_state(prompt, seed)``),
            ``{"kind": "image", "png": <base64 PNG of the fitted picture>}`` or
            ``{"kind": "savepoint", "sha256": <hex of the save file>}``, or
            ``{"kind": "history"}`` (a session restored from another replica's recent frames:
            not replayable).
        seed, prompt: the session's seed and prompt at the start.
        chunk_frames, steps: the stream's chunk size and denoising steps at the start.
        fps: the session's frame rate (pacing only: frames do not depend on it).
        chunk0, frame0: the session's stream counters at the start (event indices are
            relative to them).
    """

    def __init__(self, start: dict[str, Any], *, seed: int, prompt: str, chunk_frames: int,
                 steps: int, fps: int, chunk0: int = 0, frame0: int = 0):
        self.header = {"start": start, "seed": seed, "prompt": prompt,
                       "chunk_frames": chunk_frames, "steps": steps, "fps": fps}
        self.chunk0, self.frame0 = chunk0, frame0
        self._steps = steps
        self._events: list[dict[str, Any]] = []
        self.overflowed = False  # more than MAX_LOG_EVENTS events: the log stopped
        self._lock = threading.Lock()

    def add(self, kind: str, chunk: int, frame: int, **payload: Any) -> None:
        """Append event ``kind`` applied when the session's stream counters were ``chunk``
        and ``frame`` (absolute: the log subtracts its start)."""
        event = {"kind": kind, "chunk": chunk - self.chunk0, "frame": frame - self.frame0,
                 **payload}
        with self._lock:
            if len(self._events) >= MAX_LOG_EVENTS:
                self.overflowed = True
                return
            self._events.append(event)

    def steps_used(self, steps: int, chunk: int, frame: int) -> None:
        """The stream's next chunk is generated with ``steps``: logged when it changed without
        a settings command (degradation)."""
        if steps != self._steps:
            self._steps = steps
            self.add("steps", chunk, frame, steps=steps)

    def controls(self, chunk: int, frame: int, *, expression: str | None,
                 say: str | None) -> None:
        """A world's own controls the engine applied (the avatar's expression and/or speech
        text; the backend's ``apply_controls``), logged whether or not the keys of the action
        that carried them were stale."""
        payload = {k: v for k, v in (("expression", expression), ("say", say)) if v is not None}
        self.add("controls", chunk, frame, **payload)

    def command(self, command: Any, chunk: int, frame: int, *, applied: dict[str, Any]) -> None:
        """Log an engine command the engine applied; ``applied`` holds what it resolved to
        (the effective steps and chunk size of a settings command, a fork's id)."""
        if isinstance(command, ActionCommand):
            pointer = applied.get("pointer")  # the mouse motion it added (a mouse model's)
            self.add("action", chunk, frame, keys=sorted(command.keys),
                     **({} if pointer is None else {"pointer": list(pointer)}))
        elif isinstance(command, PromptCommand):
            self.add("prompt", chunk, frame, text=command.text, blend_text=command.blend_text,
                     blend_weight=float(command.blend_weight))
        elif isinstance(command, SettingsCommand):
            self._steps = applied["steps"]
            self.add("settings", chunk, frame, **applied)
        elif isinstance(command, ForkCommand):
            self.add("fork", chunk, frame, k=command.k, **applied)
        elif isinstance(command, AdoptCommand):
            self.add("adopt", chunk, frame, branch=command.branch)
        elif isinstance(command, RewindCommand):
            self.add("rewind", chunk, frame, chunks=command.chunks)

    def to_dict(self, *, model: str, model_version: str, chunk: int, frame: int
                ) -> dict[str, Any]:
        """The log as JSON-ready data, ending at the session's counters ``chunk``/``frame``.
        ValueError when the log overflowed (it no longer holds every event)."""
        if self.overflowed:
            raise ValueError(f"this session's input log passed {MAX_LOG_EVENTS:,} events and "
                             "stopped; save a point and start a new log from it")
        with self._lock:
            events = [dict(e) for e in self._events]
        return {"format": LOG_FORMAT, "model": model, "model_version": model_version,
                **self.header, "chunks": chunk - self.chunk0, "frames": frame - self.frame0,
                "events": events}


# ---------------------------------------------------------------- reading (schema)
class _Event(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    chunk: int = Field(ge=0)
    frame: int = Field(ge=0)


class ActionEvent(_Event):
    kind: Literal["action"]
    # DIRECTION_KEYS, or the backend's own keys (parse_log's ``keys``)
    keys: list[fields.HeldKey] = Field(max_length=4)
    # mouse motion (px) it added to the next stream chunk: a backend with mouse input
    pointer: list[fields.PointerDelta] | None = Field(default=None, min_length=2, max_length=2)


class ControlsEvent(_Event):
    """The avatar's controls (``WorldBackend.apply_controls``): at least one of the two."""

    kind: Literal["controls"]
    # the names are the world's (the core imports no world): the backend's apply_controls
    # refuses an unknown one at replay with one line; here only the length is bounded
    expression: str | None = Field(default=None, min_length=1, max_length=32)
    say: fields.SayText | None = None

    @model_validator(mode="after")
    def _one_control(self) -> ControlsEvent:
        if self.expression is None and self.say is None:
            raise ValueError("a controls event needs expression or say")
        return self


class PromptEvent(_Event):
    kind: Literal["prompt"]
    text: fields.PromptText
    blend_text: fields.PromptText | None = None
    blend_weight: float = Field(default=0.0, ge=0.0, le=1.0)


class SettingsEvent(_Event):
    kind: Literal["settings"]
    chunk_frames: fields.ChunkFrames
    steps: fields.Steps
    memory_frames: fields.MemoryFrames | None = None
    attention: str | None = Field(default=None, max_length=MAX_ATTENTION_CHARS)


class StepsEvent(_Event):
    kind: Literal["steps"]
    steps: fields.Steps


class ForkEvent(_Event):
    kind: Literal["fork"]
    k: fields.ForkBranches
    fork_id: int = Field(ge=0, le=MAX_SEED)


class PreviewEvent(_Event):
    kind: Literal["preview"]
    branch: fields.Branch
    steps: fields.Steps


class AdoptEvent(_Event):
    kind: Literal["adopt"]
    branch: fields.Branch


class RewindEvent(_Event):
    kind: Literal["rewind"]
    chunks: fields.RewindChunks


class CutEvent(_Event):
    """A fresh world (``new_state(prompt, seed)``) in place of the current one: a storyboard
    beat that asks for a cut."""

    kind: Literal["cut"]
    prompt: fields.PromptText
    seed: int = Field(ge=0, le=MAX_SEED)


LogEvent = Annotated[
    ActionEvent | ControlsEvent | PromptEvent | SettingsEvent | StepsEvent | ForkEvent
    | PreviewEvent | AdoptEvent | RewindEvent | CutEvent,
    Field(discriminator="kind"),
]


class LogStart(BaseModel):
    """Where a log starts: a prompt, a picture (``png``, base64), a save point (the file's
    ``sha256``), another replica's recent frames (``history``)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    kind: Literal["prompt", "image", "savepoint", "history"]
    png: str | None = Field(default=None, max_length=4 * 2**20)
    sha256: str | None = Field(default=None, pattern="^[0-9a-f]{64}$")

    @model_validator(mode="after")
    def _has_its_source(self) -> LogStart:
        # what the start's kind needs is present (a save point's log without its hash once
        # failed with a TypeError at replay)
        needed = {"image": "png", "savepoint": "sha256"}.get(self.kind)
        if needed is not None and getattr(self, needed) is None:
            raise ValueError(f"a start of kind {self.kind!r} needs its {needed}")
        return self


class ReplayLog(BaseModel):
    """An input log as read back (``LOG_FORMAT``)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    format: Literal["worldstream-input-log/1"]
    model: str
    model_version: str
    start: LogStart
    seed: int = Field(ge=0, le=MAX_SEED)
    prompt: fields.PromptText
    chunk_frames: fields.ChunkFrames
    steps: fields.Steps
    fps: int = Field(ge=1, le=240)
    chunks: int = Field(ge=0, le=1_000_000)
    frames: int = Field(ge=0, le=MAX_SEED)
    events: list[LogEvent]


def log_model(raw: bytes | str, name: str = "input log") -> str:
    """The model an input log names, read before the log is validated (its backend decides
    which keys its actions may hold); ValueError (one line) when it names none."""
    data = check_json(raw, name, MAX_LOG_BYTES)
    if not isinstance(data, dict) or not isinstance(data.get("model"), str):
        raise ValueError(f"{name}: model: a log is a JSON object naming its model")
    return data["model"]


def parse_log(raw: bytes | str, name: str = "input log",
              keys: tuple[str, ...] | str | None = None) -> ReplayLog:
    """Validate an input log (JSON text). ``keys``: the key names its actions may hold when
    its backend declares its own (``wire_keys``, or ``fields.ANY_KEY``: any key name, checked
    by the backend at replay); None: ``DIRECTION_KEYS``. Raises ValueError with one line
    naming ``name`` and the first bad field (``events.3.keys.0: ...``)."""
    data = check_json(raw, name, MAX_LOG_BYTES)
    if isinstance(data, dict) and data.get("format") not in (None, LOG_FORMAT):
        raise ValueError(f"{name}: format {data.get('format')!r} is not {LOG_FORMAT!r}")
    log = validate(ReplayLog, data, name, {"keys": keys} if keys else None)
    chunks = [e.chunk for e in log.events]
    if chunks != sorted(chunks):
        raise ValueError(f"{name}: events: chunk indices must not decrease")
    return log
