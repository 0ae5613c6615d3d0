"""Public types of the engine: the contract between ``engine/`` and ``streaming/``/``app/``.

Nothing here imports torch. Times are milliseconds unless the name says otherwise
(``*_ns`` = ``time.perf_counter_ns()`` nanoseconds). Frames are ``(height, width, 3)`` uint8 RGB.
"""

from __future__ import annotations

import queue
import threading
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np


class CapacityError(RuntimeError):
    """The engine cannot admit another session (page pool or session limit reached)."""

    def __init__(self, message: str, retry_after_s: float = 5.0):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class SessionClosedError(KeyError):
    """The session id is unknown or the session has ended."""


# ---------------------------------------------------------------- commands (client -> engine)
@dataclass(frozen=True)
class ActionCommand:
    """The full set of held keys from now on (empty = idle). ``t_ms`` is the client timestamp.
    ``expression`` (hold from the next frame on) and ``say`` (speech text to queue) steer
    worlds whose backend has ``apply_controls`` (the avatar); None: unchanged. ``pointer``:
    mouse motion ``(dx, dy)`` in CSS pixels since the client's previous action, summed into
    the next chunk of a backend whose ``action_space`` takes mouse input (ignored by others)."""

    seq: int
    t_ms: float
    keys: frozenset[str] = frozenset()
    expression: str | None = None
    say: str | None = None
    pointer: tuple[float, float] | None = None


@dataclass(frozen=True)
class PromptCommand:
    """Switch the scene prompt; optionally blend ``blend_text`` in with weight ``blend_weight``."""

    seq: int
    t_ms: float
    text: str
    blend_text: str | None = None
    blend_weight: float = 0.0


@dataclass(frozen=True)
class SettingsCommand:
    """New stream settings; None keeps a value. ``mode`` (``engine.core.config.MODES``) sets
    ``chunk_frames`` and ``steps`` first; explicit values in the same command override it."""

    seq: int
    steps: int | None = None
    chunk_frames: int | None = None
    fps: int | None = None
    memory_frames: int | None = None
    attention: str | None = None
    mode: str | None = None


@dataclass(frozen=True)
class ForkCommand:
    """Generate ``k`` alternative futures of the session in one batch (previews)."""

    seq: int
    k: int


@dataclass(frozen=True)
class AdoptCommand:
    """Keep branch ``branch`` of the last fork as the session's state; free the others."""

    seq: int
    branch: int


@dataclass(frozen=True)
class RewindCommand:
    """Restore the session state of ``chunks`` chunks ago (bounded history)."""

    seq: int
    chunks: int


Command = (
    ActionCommand | PromptCommand | SettingsCommand | ForkCommand | AdoptCommand | RewindCommand
)


# ---------------------------------------------------------------- outputs (engine -> client)
@dataclass
class Frame:
    """One generated RGB frame with the metadata the protocol's ``frame`` message carries.

    ``rgb``: ``(height, width, 3)`` uint8. ``index``: frame counter of the session's stream
    (0-based, monotonic). ``action_seq``: the newest action seq the frame was conditioned on
    (-1 before any action). ``action_t_ms``: that action's client timestamp (None before any).
    ``stages_ms``: wall time of each generation stage of the chunk this frame belongs to
    (e.g. ``denoise``, ``cache_fill``, ``decode``). ``t_ready_ns``: perf_counter_ns when ready.
    ``present_ns``: perf_counter_ns at which the session's playout clock shows the frame (0: at
    once). The engine's clock sets it; transports and recordings pace by it, so the engine and
    every viewer follow one clock (a settings or degradation fps change reaches them all).
    """

    session_id: str
    index: int
    rgb: np.ndarray
    action_seq: int
    prompt_version: int
    chunk_index: int
    stages_ms: dict[str, float] = field(default_factory=dict)
    t_ready_ns: int = 0
    action_t_ms: float | None = None
    present_ns: int = 0


@dataclass
class Event:
    """A session event for the client: ``kind`` in {"error", "preview", "degraded", "closed",
    "info"}; ``payload`` is JSON-ready except ``payload["frames"]`` of a preview (a list of
    ``(H, W, 3)`` uint8 arrays)."""

    kind: str
    payload: dict[str, Any]


@dataclass(frozen=True)
class SessionInfo:
    """A session's public figures. ``width``/``height``: the frames the backend makes (the
    video a transport sends may be larger: see ``pixel_art``). ``pixel_art``: the backend's
    frames are pixel art (a game's palette pixels): transports scale them up by an integer
    factor with nearest neighbour before encoding (``streaming.frames.video_scale``) and the
    page draws them with ``image-rendering: pixelated``."""

    session_id: str
    width: int
    height: int
    fps: int
    pixel_art: bool = False


class FrameSlot:
    """Thread-safe bounded FIFO of frames; when full the oldest frame is dropped (counted in
    ``dropped``).

    The producer is the engine thread, the consumer a transport or a recorder (one slot per
    consumer), so a slow consumer drops frames instead of building delay. A paced consumer takes
    frames with :meth:`take_due` (frames past their presentation time are dropped, counted in
    ``stale``); a recorder takes every frame with :meth:`get`.
    """

    def __init__(self, maxlen: int = 8):
        if maxlen < 1:
            raise ValueError(f"maxlen must be >= 1, got {maxlen}")
        self._frames: deque[Frame] = deque()
        self._maxlen = maxlen
        self._cond = threading.Condition()
        self.dropped = 0
        self.stale = 0
        self.closed = False

    def put(self, frame: Frame) -> None:
        with self._cond:
            if len(self._frames) >= self._maxlen:
                self._frames.popleft()
                self.dropped += 1
            self._frames.append(frame)
            self._cond.notify_all()

    def get(self, timeout: float | None = None) -> Frame | None:
        """Oldest frame, waiting up to ``timeout`` s; None on timeout or when closed and empty."""
        with self._cond:
            if not self._frames and not self.closed:
                self._cond.wait(timeout)
            return self._frames.popleft() if self._frames else None

    def get_nowait(self) -> Frame | None:
        with self._cond:
            return self._frames.popleft() if self._frames else None

    def take_due(self, now_ns: int) -> tuple[Frame | None, int | None]:
        """Latest wins: the newest frame whose ``present_ns`` is due by ``now_ns``, dropping
        (and counting in ``stale``) the older due frames a slow consumer did not take in time.
        Returns ``(frame, None)``, or ``(None, present_ns of the oldest frame held)`` when none
        is due yet, or ``(None, None)`` when the slot is empty."""
        with self._cond:
            frames = self._frames
            while len(frames) >= 2 and frames[1].present_ns <= now_ns:
                frames.popleft()
                self.stale += 1
            if not frames:
                return None, None
            if frames[0].present_ns <= now_ns:
                return frames.popleft(), None
            return None, frames[0].present_ns

    def __len__(self) -> int:
        with self._cond:
            return len(self._frames)

    def close(self) -> None:
        with self._cond:
            self.closed = True
            self._cond.notify_all()


class EventQueue(queue.Queue):
    """A session's events for its connections: a ``queue.Queue`` of :class:`Event` that never
    holds more than ``maxlen`` events nor more than ``max_previews`` previews.

    A preview carries frames (a fork of 4 branches is ~0.8 MB of pixels) and only the newest
    fork's previews matter, so a new preview evicts the oldest queued one beyond
    ``max_previews``; past ``maxlen`` the oldest event of any kind goes. ``dropped`` counts
    evictions. This bounds a session's memory when its client stops reading (a client forking
    without reading would otherwise grow the server without bound). ``put`` never blocks."""

    def __init__(self, maxlen: int = 64, max_previews: int = 8):
        super().__init__()
        self.maxlen, self.max_previews = maxlen, max_previews
        self.dropped = 0

    def _put(self, item: Event) -> None:  # called by put() under the queue's lock
        events = self.queue
        events.append(item)
        if item.kind == "preview":
            previews = [e for e in events if e.kind == "preview"]
            for old in previews[: max(len(previews) - self.max_previews, 0)]:
                events.remove(old)
                self.dropped += 1
        while len(events) > self.maxlen:
            events.popleft()
            self.dropped += 1


class EngineAPI(Protocol):
    """What ``streaming/`` and ``app/`` may call. All methods are thread-safe and never block on
    generation (commands are queued to the engine thread)."""

    model_name: str
    capacity: int
    #: the world it streams (``landscape``, ``avatar``, ``game``): the page adapts to it
    world: str
    #: the model's own key names (None: ``limits.DIRECTION_KEYS``) and the page's key map
    wire_keys: tuple[str, ...] | None
    controls: dict[str, Any] | None
    #: whether the model takes mouse motion (the page captures the pointer only then)
    mouse: bool
    #: its frames are pixel art (scaled up with nearest neighbour before encoding)
    pixel_art: bool
    #: media leave from the replicas' hosts (a cluster front end), not from this process
    media_on_replicas: bool

    def create_session(
        self, prompt: str, seed: int | None = None, fps: int | None = None
    ) -> SessionInfo: ...  # raises CapacityError, ValueError

    def submit(self, session_id: str, command: Command) -> None: ...  # raises SessionClosedError

    def subscribe(self, session_id: str, maxlen: int = 8) -> FrameSlot: ...

    def set_paused(self, session_id: str, paused: bool) -> None: ...

    def events(self, session_id: str) -> EventQueue: ...

    def close_session(self, session_id: str) -> None: ...

    def num_sessions(self) -> int: ...

    def metrics(self) -> dict[str, Any]: ...

    def latency_budget(self, session_id: str) -> dict[str, Any]: ...  # raises SessionClosedError


@runtime_checkable
class RunsStudio(Protocol):
    """An engine that runs the studio operations itself (``engine.studio.worldio``'s
    functions by name: the scale-out router runs each on the session's replica)."""

    def studio(self, op: str, session_id: str, *args: Any) -> Future: ...
