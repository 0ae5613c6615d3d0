"""The engine's one configuration dataclass, validated on construction."""

from __future__ import annotations

from dataclasses import dataclass, fields

from worldstream.engine.core.limits import MAX_CHUNK_FRAMES, MAX_FORK_BRANCHES, MAX_STEPS


@dataclass(frozen=True)
class Mode:
    """A latency/quality preset of a stream: frames per chunk (the backend's supported size
    nearest to it is used) and denoising steps."""

    name: str
    chunk_frames: int
    steps: int


#: the two modes a user picks (page, ``--mode``, ``settings.mode``): *responsive* answers a key
#: within one small chunk at few steps; *quality* spends more steps on larger chunks
MODES: dict[str, Mode] = {
    "responsive": Mode("responsive", chunk_frames=1, steps=2),
    "quality": Mode("quality", chunk_frames=2, steps=4),
}


@dataclass
class EngineConfig:
    """Settings of :class:`engine.core.engine.Engine` (the line under each field is its doc).
    ``__post_init__`` raises ValueError naming the first invalid field."""

    max_sessions: int = 4
    """Sessions admitted at once (the backend's ``max_states`` also limits)."""
    fps: int | None = None
    """Default target frames per second of a session (None: backend ``default_fps``)."""
    max_fps: int = 60
    """The highest fps a client may request."""
    mode: str | None = None
    """The sessions' starting mode (a key of :data:`MODES`; it sets chunk frames and steps) or
    None: ``steps`` and ``chunk_frames`` below."""
    steps: int = 4
    """Default denoising steps per chunk (1-4) when ``mode`` is None."""
    chunk_frames: int | None = None
    """Frames per chunk (1-4; None: backend ``chunk_frames``) when ``mode`` is None."""
    max_batch: int = 8
    """Most chunk jobs in one ``backend.generate`` call."""
    buffer_max_frames: int = 8
    """The most frames a session may be generated ahead of its playout clock (chunks start just in
    time, see ``jit_margin_ms``; this bounds the start)."""
    batch_join_frames: int = 2
    """A chunk may join a batch started for another session up to this many frame intervals before
    its own just-in-time start (0: no joining)."""
    jit_margin_ms: float = 5.0
    """A chunk starts at its first frame's presentation time minus the p95 of the session's recent
    chunk times minus this margin, ms."""
    slot_maxlen: int = 8
    """Default size of a subscriber's frame slot."""
    preview_chunks: int = 2
    """Chunks generated per branch of a fork."""
    preview_max_wait_ms: float = 250.0
    """Fork previews run in the slack between stream chunks, or once they have waited this long
    (then a stream may be late once)."""
    max_fork: int = MAX_FORK_BRANCHES
    """The largest ``k`` of a fork."""
    rewind_chunks: int = 8
    """The deepest rewind accepted (the backend may keep less)."""
    degrade_after_misses: int = 3
    """Consecutive late chunks of a session before it degrades one level."""
    recover_after_chunks: int = 60
    """Consecutive on-time chunks before one level is restored."""
    min_steps: int = 1
    """Degradation lowers steps down to this, then lowers fps."""
    min_fps: int = 4
    """Degradation never lowers fps below this."""
    fps_degrade_factor: float = 0.75
    """Fps multiplier per fps degradation level, in (0, 1)."""
    retry_after_s: float = 5.0
    """The ``retry_after_s`` of a CapacityError."""
    metrics_window_s: float = 2.0
    """Span of the measured-fps window."""
    prompts_per_s: float = 2.0
    """Prompt encodings per second per session (off the engine thread); faster prompts are
    coalesced, the latest wins (``engine.core.prompts``)."""

    def __post_init__(self) -> None:
        for f in fields(self):
            if f.type not in ("int", "int | None"):
                continue
            value = getattr(self, f.name)
            if value is None and f.type == "int | None":
                continue
            minimum = 0 if f.name == "batch_join_frames" else 1
            if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
                raise ValueError(f"{f.name} must be an int >= {minimum}, got {value!r}")
        if self.mode is not None and self.mode not in MODES:
            raise ValueError(f"mode must be one of {sorted(MODES)} or None, got {self.mode!r}")
        if not 1 <= self.steps <= MAX_STEPS:
            raise ValueError(f"steps must be in [1, {MAX_STEPS}], got {self.steps}")
        if self.max_fork > MAX_FORK_BRANCHES:
            raise ValueError(f"max_fork must be <= {MAX_FORK_BRANCHES}, got {self.max_fork}")
        if not 1 <= self.min_steps <= self.steps:
            raise ValueError(f"min_steps must be in [1, steps={self.steps}], got {self.min_steps}")
        if self.chunk_frames is not None and self.chunk_frames > MAX_CHUNK_FRAMES:
            raise ValueError(
                f"chunk_frames must be in [1, {MAX_CHUNK_FRAMES}], got {self.chunk_frames}"
            )
        # NOTE: that the buffer holds a whole chunk (plus batch_join_frames) depends on the
        # model's chunk size, so the Engine checks it against its backend
        if self.fps is not None and not self.min_fps <= self.fps <= self.max_fps:
            raise ValueError(f"fps must be in [{self.min_fps}, {self.max_fps}], got {self.fps}")
        if self.min_fps > self.max_fps:
            raise ValueError(f"min_fps ({self.min_fps}) must be <= max_fps ({self.max_fps})")
        if not 0.0 < self.fps_degrade_factor < 1.0:
            raise ValueError(f"fps_degrade_factor must be in (0, 1), got {self.fps_degrade_factor}")
        if not self.jit_margin_ms >= 0:
            raise ValueError(f"jit_margin_ms must be >= 0, got {self.jit_margin_ms!r}")
        if not self.preview_max_wait_ms >= 0:
            raise ValueError(f"preview_max_wait_ms must be >= 0, got {self.preview_max_wait_ms!r}")
        for name in ("retry_after_s", "metrics_window_s", "prompts_per_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")
