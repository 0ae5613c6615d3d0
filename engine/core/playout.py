"""Each stream's playout clock and its deliberate degradation: torch-free bookkeeping on ints
and floats; every time is an explicit ``now_ns`` argument (``time.perf_counter_ns`` in the
engine, a fake clock in tests). A session owns one of each; the scheduler reads its clock."""

from __future__ import annotations

from collections.abc import Callable

NS = 1_000_000_000


class PlayoutClock:
    """The presentation clock of one stream: frame ``f`` is on screen at
    ``anchor_ns + (f - anchor_frame) / fps`` seconds.

    The clock starts when the first chunk is ready (time to first frame is not a miss). The
    *playout buffer* is the number of frames generated ahead of the clock; a negative buffer
    means the viewer waited for frames (a stall), after which the clock is re-anchored at the
    stream's end, so late frames are shown late once instead of the delay piling up.
    """

    def __init__(self, fps: float, created_ns: int):
        if fps <= 0:
            raise ValueError(f"fps must be > 0, got {fps}")
        self.fps = fps
        self.started = False
        self.anchor_ns = created_ns
        self.anchor_frame = 0.0  # frames presented at anchor_ns (fractional)

    def presented(self, now_ns: int) -> float:
        """Frames presented by ``now_ns`` (fractional; 0 before the start)."""
        if not self.started:
            return 0.0
        return self.anchor_frame + (now_ns - self.anchor_ns) * self.fps / NS

    def buffer_frames(self, generated: int, now_ns: int) -> float:
        """Frames generated ahead of the clock (negative: the viewer is waiting)."""
        return generated - self.presented(now_ns)

    def time_of_frame(self, frame: float) -> int:
        """``perf_counter_ns`` at which ``frame`` is presented (the creation time before the
        clock starts: the first chunk is wanted at once)."""
        if not self.started:
            return self.anchor_ns
        return self.anchor_ns + round((frame - self.anchor_frame) * NS / self.fps)

    def deadline_ns(self, generated: int) -> int:
        """When the buffer of a stream with ``generated`` frames runs out."""
        return self.time_of_frame(generated)

    def due_at_ns(self, generated: int, chunk_frames: int, max_frames: int) -> int:
        """The earliest time the next chunk keeps the buffer within ``max_frames``."""
        return self.time_of_frame(generated + chunk_frames - max_frames)

    def anchor(self, frame: int, now_ns: int) -> None:
        """Present ``frame`` at ``now_ns`` (starts the clock, or re-anchors it)."""
        self.started = True
        self.anchor_frame = frame
        self.anchor_ns = now_ns

    def set_fps(self, fps: float, now_ns: int) -> None:
        """Change the rate from now on without a jump in the presented position."""
        if fps <= 0:
            raise ValueError(f"fps must be > 0, got {fps}")
        if self.started:
            self.anchor_frame = self.presented(now_ns)
            self.anchor_ns = now_ns
        self.fps = fps


class DegradeController:
    """Degradation levels of one session: level 0 runs the requested steps and fps; each level
    above drops to the next step count (down to ``min_steps``) that costs less than the one
    above it, then multiplies fps by ``factor`` (down to ``min_fps``). ``step_cost``: a chunk's
    relative cost at each step count (the backend's optional ``step_cost``, e.g. forwards per
    chunk); None: cost = steps, so each level drops one step. A step count no cheaper than the
    one above it is skipped: it would slow a late session down, or not speed it up.

    ``record(late)`` is called once per chunk; ``misses`` consecutive late chunks raise the
    level by one, ``recover`` consecutive on-time chunks lower it by one.
    """

    def __init__(
        self,
        steps: int,
        fps: int,
        *,
        min_steps: int,
        min_fps: int,
        factor: float,
        misses: int,
        recover: int,
        step_cost: Callable[[int], float] | None = None,
    ):
        self.min_steps, self.min_fps, self.factor = min_steps, min_fps, factor
        self._cost = step_cost or float
        self.misses, self.recover = misses, recover
        self.level = 0
        self._late_run = 0
        self._on_time_run = 0
        self.set_requested(steps=steps, fps=fps)

    def set_requested(self, steps: int | None = None, fps: int | None = None) -> None:
        """New requested steps/fps (a client setting); the level is clamped to the new range."""
        if steps is not None:
            self.requested_steps = max(steps, self.min_steps)
            ladder = [self.requested_steps]
            for n in range(self.requested_steps - 1, self.min_steps - 1, -1):
                if self._cost(n) < self._cost(ladder[-1]):
                    ladder.append(n)
            self._ladder = ladder  # the step count at each step level
        if fps is not None:
            self.requested_fps = max(fps, self.min_fps)
        self.level = min(self.level, self.max_level)

    @property
    def _step_levels(self) -> int:
        return len(self._ladder) - 1

    @property
    def max_level(self) -> int:
        level = self._step_levels
        while self._fps_at(level) > self.min_fps:
            level += 1
        return level

    def _fps_at(self, level: int) -> int:
        fps_levels = max(level - self._step_levels, 0)
        return max(self.min_fps, round(self.requested_fps * self.factor**fps_levels))

    @property
    def steps(self) -> int:
        return self._ladder[min(self.level, self._step_levels)]

    @property
    def fps(self) -> int:
        return self._fps_at(self.level)

    @property
    def degraded(self) -> bool:
        return self.level > 0

    def record(self, late: bool) -> int:
        """Account one chunk; returns the level change (+1 degraded, -1 recovered, 0)."""
        if late:
            self._late_run += 1
            self._on_time_run = 0
            if self._late_run >= self.misses and self.level < self.max_level:
                self.level += 1
                self._late_run = 0
                return 1
        else:
            self._on_time_run += 1
            self._late_run = 0
            if self._on_time_run >= self.recover and self.level > 0:
                self.level -= 1
                self._on_time_run = 0
                return -1
        return 0
