"""Every message of the wire protocol (``streaming/PROTOCOL.md`` v1 plus the extensions in
``streaming/PROTOCOL_EXTENSIONS.md``) as pydantic models, and the one parser that turns raw
client text into a validated message or a :class:`MessageError` naming the field and reason.

Client messages are strict (no string-to-int coercion, no unknown fields); an ``error`` reply
carries pydantic's error type as ``code`` (e.g. ``string_too_long``, ``missing``) so a client
can react to it without parsing prose.
"""

from __future__ import annotations

import json
import math
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator

from worldstream.engine.core import api, fields
from worldstream.engine.core.limits import (
    DIRECTION_KEYS,
    MAX_ATTENTION_CHARS,
    MAX_FORK_BRANCHES,  # noqa: F401  # the wire's bounds, read as messages.MAX_*
    MAX_PROMPT_CHARS,
)
from worldstream.engine.core.reader import json_depth
from worldstream.engine.worlds.avatar.actions import EXPRESSIONS

#: the largest control message accepted, bytes of UTF-8 (PROTOCOL: 4 KB)
MAX_MESSAGE_BYTES = 4096
#: the largest HTTP JSON body (an SDP offer is 3-8 KB)
MAX_HTTP_BODY_BYTES = 65536

# NOTE: Literal of a tuple is the Literal of its members (one definition of the keys)
Key = Literal[DIRECTION_KEYS]  # type: ignore[valid-type]
Expression = Literal[EXPRESSIONS]  # type: ignore[valid-type]  # the avatar's (keys 1-5)


#: the largest ``seq``: JavaScript's Number.MAX_SAFE_INTEGER (a browser cannot count further);
#: an unbounded one (10**100) was accepted and then made every later message "old"
MAX_SEQ = 2**53 - 1


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


def _finite(value: float) -> float:
    if not math.isfinite(value):
        raise ValueError("must be a finite number")
    return value


def _not_blank(text: str) -> str:
    if not text.strip():
        raise ValueError("must not be blank")
    return text


# ---------------------------------------------------------------- client -> server
class ActionMessage(_Strict):
    """The full set of held keys from now on (empty = idle); ``t`` = client clock, ms.
    Avatar world: ``expression`` holds a face from the next frame on, ``say`` queues speech
    (other worlds answer them with ``unsupported``)."""

    type: Literal["action"]
    seq: int = Field(ge=0, le=MAX_SEQ)
    t: float
    # one of DIRECTION_KEYS, or of the backend's own keys (parse_client_message's ``keys``)
    keys: list[fields.HeldKey] = Field(max_length=4)
    # [dx, dy] CSS pixels since the previous action, finite, within MAX_POINTER_DELTA
    pointer: list[fields.PointerDelta] | None = Field(default=None, min_length=2, max_length=2)
    expression: Expression | None = None
    say: fields.SayText | None = None

    _t_finite = field_validator("t")(_finite)

    @field_validator("keys")
    @classmethod
    def _unique(cls, keys: list[str]) -> list[str]:
        if len(set(keys)) != len(keys):
            raise ValueError("keys must not repeat")
        return keys


class Blend(_Strict):
    text: fields.PromptText
    weight: float = Field(ge=0.0, le=1.0)


class PromptMessage(_Strict):
    type: Literal["prompt"]
    seq: int = Field(ge=0, le=MAX_SEQ)
    t: float
    text: fields.PromptText
    blend: Blend | None = None

    _t_finite = field_validator("t")(_finite)
    _text_not_blank = field_validator("text")(_not_blank)


class SettingsMessage(_Strict):
    type: Literal["settings"]
    seq: int = Field(ge=0, le=MAX_SEQ)
    steps: fields.Steps | None = None
    chunk_frames: fields.ChunkFrames | None = None
    fps: int | None = Field(default=None, ge=1, le=60)
    memory_frames: fields.MemoryFrames | None = None
    attention: str | None = Field(default=None, min_length=1, max_length=MAX_ATTENTION_CHARS)
    mode: Literal["responsive", "quality"] | None = None


class ForkMessage(_Strict):
    type: Literal["fork"]
    seq: int = Field(ge=0, le=MAX_SEQ)
    k: fields.ForkBranches


class AdoptMessage(_Strict):
    type: Literal["adopt"]
    seq: int = Field(ge=0, le=MAX_SEQ)
    branch: fields.Branch


class RewindMessage(_Strict):
    type: Literal["rewind"]
    seq: int = Field(ge=0, le=MAX_SEQ)
    chunks: fields.RewindChunks


class PingMessage(_Strict):
    type: Literal["ping"]
    seq: int = Field(ge=0, le=MAX_SEQ)
    t: float

    _t_finite = field_validator("t")(_finite)


class NextMessage(_Strict):
    """WebSocket pull-based flow control: the client is ready for one more frame."""

    type: Literal["next"]


class RecordMessage(_Strict):
    """Extension: start or stop recording the session to MP4."""

    type: Literal["record"]
    seq: int = Field(ge=0, le=MAX_SEQ)
    on: bool


ClientMessage = Annotated[
    ActionMessage | PromptMessage | SettingsMessage | ForkMessage | AdoptMessage
    | RewindMessage | PingMessage | NextMessage | RecordMessage,
    Field(discriminator="type"),
]
_CLIENT_ADAPTER: TypeAdapter[Any] = TypeAdapter(ClientMessage)


class MessageError(ValueError):
    """A rejected client message: ``code`` (machine-readable), ``field`` (dotted path or
    ``"message"`` for the whole message), ``reason`` (prose), ``seq`` (when readable)."""

    def __init__(self, code: str, field: str, reason: str, seq: int | None = None):
        super().__init__(f"{field}: {reason}")
        self.code, self.field, self.reason, self.seq = code, field, reason, seq

    def to_message(self) -> dict[str, Any]:
        return ErrorMessage(seq=self.seq, code=self.code, field=self.field,
                            message=self.reason).model_dump(exclude_none=True)


def _seq_of(data: Any) -> int | None:
    seq = data.get("seq") if isinstance(data, dict) else None
    return seq if isinstance(seq, int) and not isinstance(seq, bool) else None


#: deepest nesting of arrays/objects a client message may have (the protocol needs 3)
MAX_JSON_DEPTH = 16


def parse_client_message(raw: str | bytes, keys: tuple[str, ...] | None = None) -> Any:
    """Validate one client text message; returns an instance of one ``*Message`` class above.
    ``keys``: the key names an ``action`` may hold when the backend declares its own
    (``wire_keys``: a game's ``fire``); None: ``DIRECTION_KEYS``.

    Raises :class:`MessageError`: ``too_large`` (over ``MAX_MESSAGE_BYTES``), ``malformed``
    (not UTF-8 / not a JSON object / nested deeper than ``MAX_JSON_DEPTH``), ``unknown_type``,
    or pydantic's error type for the first invalid field.
    """
    size = len(raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw)
    if size > MAX_MESSAGE_BYTES:
        raise MessageError("too_large", "message",
                           f"{size} bytes exceeds the limit of {MAX_MESSAGE_BYTES} bytes")
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
    except UnicodeDecodeError as err:
        raise MessageError("malformed", "message", f"not valid JSON: {err}") from None
    if json_depth(text) > MAX_JSON_DEPTH:
        raise MessageError("malformed", "message", f"nested deeper than {MAX_JSON_DEPTH} levels")
    try:
        data = json.loads(text)
    except ValueError as err:
        raise MessageError("malformed", "message", f"not valid JSON: {err}") from None
    if not isinstance(data, dict):
        raise MessageError("malformed", "message", "must be a JSON object")
    seq = _seq_of(data)
    if "type" not in data:
        raise MessageError("missing", "type", "field required", seq)
    try:
        return _CLIENT_ADAPTER.validate_python(data, context={"keys": tuple(keys)} if keys
                                               else None)
    except ValidationError as err:
        first = err.errors(include_url=False)[0]
        if first["type"] in ("union_tag_invalid", "union_tag_not_found"):
            raise MessageError("unknown_type", "type",
                               f"unknown message type {data.get('type')!r}", seq) from None
        loc = [str(part) for part in first["loc"][1:]]  # drop the union tag
        raise MessageError(first["type"], ".".join(loc) or "message", first["msg"],
                           seq) from None


def to_command(message: Any) -> api.Command:
    """The engine command for a steering message (action, prompt, settings, fork, adopt,
    rewind); raises TypeError for messages the transport handles itself (ping, next, record)."""
    match message:
        case ActionMessage():
            # ``pointer`` reaches a backend whose action_space takes mouse input; the engine
            # drops it for the others (v1)
            pointer = None if message.pointer is None else tuple(message.pointer)
            return api.ActionCommand(message.seq, message.t, frozenset(message.keys),
                                     expression=message.expression, say=message.say,
                                     pointer=pointer)
        case PromptMessage(blend=None):
            return api.PromptCommand(message.seq, message.t, message.text)
        case PromptMessage():
            return api.PromptCommand(message.seq, message.t, message.text, message.blend.text,
                                     message.blend.weight)
        case SettingsMessage():
            return api.SettingsCommand(message.seq, message.steps, message.chunk_frames,
                                       message.fps, message.memory_frames, message.attention,
                                       message.mode)
        case ForkMessage():
            return api.ForkCommand(message.seq, message.k)
        case AdoptMessage():
            return api.AdoptCommand(message.seq, message.branch)
        case RewindMessage():
            return api.RewindCommand(message.seq, message.chunks)
    raise TypeError(f"{type(message).__name__} is not an engine command")


# ---------------------------------------------------------------- server -> client
class FrameMessage(BaseModel):
    """Per-frame metadata, sent before its frame. ``rtp_ts``: pts on the 90 kHz clock from 0.
    Extensions: ``action_t`` (client timestamp of action ``action_seq``), ``chunk_index``,
    ``queue_ms`` (time from generation to send)."""

    type: Literal["frame"] = "frame"
    index: int
    rtp_ts: int
    action_seq: int
    prompt_version: int
    stages_ms: dict[str, float]
    action_t: float | None = None
    chunk_index: int | None = None
    queue_ms: float | None = None


class ErrorMessage(BaseModel):
    type: Literal["error"] = "error"
    seq: int | None = None
    code: str
    field: str | None = None
    message: str


class PongMessage(BaseModel):
    type: Literal["pong"] = "pong"
    seq: int
    t: float
    server_t: float


class StatsMessage(BaseModel):
    """Periodic: frames sent per second, frames dropped, slot depth, generation ms per chunk,
    server-side queue latency percentiles (ms) and the session's designed latency ``budget``
    (``Engine.latency_budget``: mode, chunk_frames, steps, fps, plan_ms, wait_ms, floor_ms)."""

    model_config = ConfigDict(extra="allow")

    type: Literal["stats"] = "stats"
    fps: float
    buffer_depth: int
    dropped: int
    gen_ms: float | None = None
    queue_ms_p50: float | None = None
    queue_ms_p95: float | None = None
    budget: dict[str, Any] | None = None


class PreviewMessage(BaseModel):
    """Extension: thumbnails of the branches of a fork, as JPEG data URLs."""

    type: Literal["preview"] = "preview"
    seq: int | None = None
    fork_id: int | None = None
    branches: list[dict[str, Any]]


class EventMessage(BaseModel):
    """Extension: other engine events (``degraded``, ``info``, ``closed``, ``recording``)."""

    model_config = ConfigDict(extra="allow")

    type: Literal["event"] = "event"
    kind: str


# ---------------------------------------------------------------- HTTP bodies
class CreateSessionRequest(_Strict):
    """``prompt``: the world's text; "" or absent for a world that takes none (a game), which
    the server checks (a text world answers 400 ``field: "prompt"``)."""

    prompt: str = Field(default="", max_length=MAX_PROMPT_CHARS)
    seed: int | None = Field(default=None, ge=0, lt=2**31)
    fps: int | None = Field(default=None, ge=1, le=60)


class OfferRequest(_Strict):
    sdp: str = Field(min_length=1, max_length=MAX_HTTP_BODY_BYTES)
    type: Literal["offer"]


class SessionCreated(BaseModel):
    session_id: str
    token: str
    width: int
    height: int
    fps: int
    #: extension: the world's frames are pixel art (sent scaled up by an integer factor with
    #: nearest neighbour; a page draws them with ``image-rendering: pixelated``)
    pixel_art: bool = False


def parse_body(model: type[BaseModel], raw: bytes) -> Any:
    """Validate an HTTP JSON body; raises :class:`MessageError` (``too_large`` -> 413, others
    -> 400) naming the field."""
    if len(raw) > MAX_HTTP_BODY_BYTES:
        raise MessageError("too_large", "body",
                           f"{len(raw)} bytes exceeds the limit of {MAX_HTTP_BODY_BYTES} bytes")
    if json_depth(raw) > MAX_JSON_DEPTH:
        raise MessageError("malformed", "body", f"nested deeper than {MAX_JSON_DEPTH} levels")
    try:
        return model.model_validate_json(raw)
    except ValidationError as err:
        first = err.errors(include_url=False)[0]
        if first["type"] == "json_invalid":
            raise MessageError("malformed", "body", f"not valid JSON: {first['msg']}") from None
        loc = ".".join(str(part) for part in first["loc"])
        raise MessageError(first["type"], loc or "body", first["msg"]) from None
