"""``--model emulated``: a **simulation** of an accelerator-backed model, for measuring
scale-out where no GPU is present. Not a model: the frames are the ground-truth simulator's
(:mod:`engine.backends.sim.backend`), upscaled to the emulated frame size, and each batch takes the
time a published GPU model would take, spent *waiting* (``time.sleep``), not computing.

NOTE: why waiting. The host process of a GPU replica spends a chunk blocked on the device;
its CPU cost is small. A CPU model instead would make replicas on one machine fight over the
same cores (two simulator replicas gave 1.10x on this 2-core machine), so throughput scaling,
placement and failover could never be measured here. Sleeping for the modelled time keeps the
replica's CPU near idle, as on a GPU host, while every chunk still takes as long as it would.

The cost model (:class:`EmulatedCost`): one batched call of ``rows`` chunk jobs costs
``t = a + b * sum(frames of each row) * (width * height) / (832 * 480)`` ms. Calibrated from
Self-Forcing (Huang et al., 2025, arXiv:2506.08009, Table 1: the chunk-wise Wan2.1-1.3B
model streams 832x480 at 17.0 FPS with 0.69 s latency on one H100; chunks of 3 latent = 12
video frames, 4 steps), i.e. 706 ms per 12-frame chunk at batch 1 (this project's own H200 run
of the same shapes, ``bench/h200/gpu_wan_reference.json``, measured 751 ms). ``a`` = 20 ms is
an assumption, not a published figure: the per-call overhead (Python, kernel launches) that
batching amortises; a 1.3B DiT at 4,680 tokens per row is compute-bound, so the rest is per
row: ``b = (706 - 20) / 12 = 57.2`` ms per 832x480 frame. Cost scales with the frame's area
(tokens); attention's quadratic term is ignored, which over-estimates small frames.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from worldstream.engine.backends.sim.backend import SimBackend
from worldstream.engine.core.backend import ChunkJob, ChunkResult
from worldstream.engine.worlds.simulator import SIZE

#: the frame size the cost model is calibrated at (Self-Forcing's 832x480)
REF_WIDTH, REF_HEIGHT = 832, 480
#: frame sizes offered by ``--frame-size`` (width, height): the simulator's own, and Wan's
FRAME_SIZES = {"128x128": (128, 128), "832x480": (832, 480)}


@dataclass(frozen=True)
class EmulatedCost:
    """``t(batch) = a_ms + b_ms * frames * area / (832 * 480)``, ms per batched call.

    Args:
        a_ms: fixed cost of one batched call, ms (>= 0).
        b_ms: cost of one 832x480 frame of one row, ms (>= 0).
    Raises ValueError for a negative or non-finite value."""

    a_ms: float = 20.0
    b_ms: float = 57.2

    def __post_init__(self) -> None:
        for name in ("a_ms", "b_ms"):
            value = getattr(self, name)
            if not np.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")

    def chunk_ms(self, frames_per_row: list[int], width: int, height: int) -> float:
        """Modelled time of one batched call whose rows generate ``frames_per_row`` frames of
        ``width`` x ``height``, ms (0 for an empty batch)."""
        if not frames_per_row:
            return 0.0
        scale = width * height / (REF_WIDTH * REF_HEIGHT)
        return self.a_ms + self.b_ms * sum(frames_per_row) * scale

    def sessions_per_replica(self, fps: float, chunk_frames: int, width: int,
                             height: int) -> int:
        """How many sessions of ``fps`` with chunks of ``chunk_frames`` one replica keeps up
        with when all their chunks run in one batch: the largest n with
        ``t(n rows) <= chunk_frames / fps``."""
        budget_ms = 1e3 * chunk_frames / fps
        per_row = self.chunk_ms([chunk_frames], width, height) - self.a_ms
        if per_row <= 0:
            raise ValueError("b_ms is 0: the model is never the bound")
        return max(0, int((budget_ms - self.a_ms) // per_row))


def keyword_scene(prompt: str) -> str:
    """The simulator scene a prompt names by keyword (``desert``, ``snow``, ``night``; else
    ``meadow``).

    NOTE: the emulated backend's default instead of the sentence-embedding model: loading
    that model costs a replica process ~11 s of CPU at start, which on this machine would be
    the bulk of a scale-out measurement's CPU; what a prompt shows is not what is measured."""
    from worldstream.engine.worlds.scenes import SCENE_NAMES

    words = prompt.lower()
    return next((name for name in SCENE_NAMES if name in words), "meadow")


def upscaler(src: int, width: int, height: int) -> Callable[[np.ndarray], np.ndarray]:
    """Nearest-neighbour resize of ``(F, src, src, 3)`` frames to ``(F, height, width, 3)``:
    two gathers with precomputed indices (about a millisecond a frame at 832x480), the
    identity at the simulator's own size."""
    if (width, height) == (src, src):
        return lambda frames: frames
    rows = np.arange(height) * src // height
    cols = np.arange(width) * src // width
    return lambda frames: np.ascontiguousarray(frames[:, rows][:, :, cols])


class EmulatedBackend(SimBackend):
    """The simulator's world at ``width`` x ``height``, each batch lasting ``cost``'s time.

    Args:
        width, height: the emulated frame size (``FRAME_SIZES``; any size >= 16 works).
        cost: the timing model (default: Self-Forcing on one H100, see the module docstring).
        sleep: how the modelled time is waited (tests pass a recorder).
        **sim_kwargs: the simulator backend's arguments (``max_states``, ...); ``scene_for``
            defaults to :func:`keyword_scene`.
    Raises ValueError for a size below 16.
    """

    name = "emulated"

    def __init__(self, *, width: int = 128, height: int = 128,
                 cost: EmulatedCost | None = None,
                 sleep: Callable[[float], None] = time.sleep, **sim_kwargs):
        sim_kwargs.setdefault("scene_for", keyword_scene)
        super().__init__(**sim_kwargs)
        if not (isinstance(width, int) and isinstance(height, int) and min(width, height) >= 16):
            raise ValueError(f"width and height must be ints >= 16, got {width}x{height}")
        src: int = SIZE
        self.width, self.height = width, height
        self.cost = cost or EmulatedCost()
        self._sleep = sleep
        self._upscale = upscaler(src, width, height)

    def generate(self, jobs: list[ChunkJob]) -> list[ChunkResult]:
        """The simulator's frames, upscaled, returned once the modelled batch time has passed
        since the call began (the simulator's own CPU time counts toward it).
        ``stages_ms``: ``simulate`` (real CPU work) and ``emulated_wait`` (the sleep)."""
        t0 = time.perf_counter()
        results = super().generate(jobs)
        for result in results:
            if result.error is None:
                result.frames = self._upscale(result.frames)
        budget_ms = self.cost.chunk_ms([job.num_frames for job in jobs], self.width,
                                       self.height)
        wait_ms = max(0.0, budget_ms - (time.perf_counter() - t0) * 1e3)
        self._sleep(wait_ms / 1e3)
        for result in results:
            result.stages_ms["emulated_wait"] = wait_ms
        return results


def load_emulated_backend(frame_size: str | None = None, a_ms: float | None = None,
                          b_ms: float | None = None, **kwargs) -> EmulatedBackend:
    """The registry's factory: ``frame_size`` one of ``FRAME_SIZES`` (default 128x128),
    ``a_ms``/``b_ms`` override the cost model. ValueError for an unknown size."""
    if frame_size is not None:
        if frame_size not in FRAME_SIZES:
            raise ValueError(f"frame_size must be one of {sorted(FRAME_SIZES)}, got "
                             f"{frame_size!r}")
        kwargs["width"], kwargs["height"] = FRAME_SIZES[frame_size]
    default = EmulatedCost()
    cost = EmulatedCost(default.a_ms if a_ms is None else a_ms,
                        default.b_ms if b_ms is None else b_ms)
    return EmulatedBackend(cost=cost, **kwargs)
