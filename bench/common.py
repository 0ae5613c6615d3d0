"""Shared benchmark helpers: what machine a number was measured on, and a steady timer."""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from worldstream.app.train_out import cpu_name

_cpu_model = cpu_name  # the one reading of the CPU's name, shared with training records


def _cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def hardware_info() -> dict:
    """Describe the machine and software stack of a measurement (JSON-serialisable dict).

    Keys: ``cpu_model``, ``cpu_cores`` (logical, ``os.cpu_count``), ``torch_threads``,
    ``load_avg_1m`` (other work on the machine skews CPU timings),
    ``cpu_features`` (the ISA extensions that decide CPU matmul speed), ``gpu`` (name or
    None), ``gpu_memory_gib``, ``cuda``, ``python``, ``platform``, ``torch``, ``triton``.
    """
    import torch

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    wanted = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "neon")
    info = {
        "cpu_model": _cpu_model(),
        "cpu_cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "load_avg_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "cpu_features": sorted(f for f in wanted if f in _cpu_flags()),
        "gpu": None,
        "gpu_memory_gib": None,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "triton": triton_version,
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info["gpu"] = props.name
        info["gpu_memory_gib"] = round(props.total_memory / 2**30, 1)
    return info


def time_call(
    fn: Callable[[], object],
    *,
    warmup: int = 2,
    repeats: int = 10,
    sync: Callable[[], None] | None = None,
) -> dict:
    """Run ``fn`` ``warmup`` times, then time ``repeats`` runs (wall clock, ``perf_counter``).

    ``sync`` (e.g. ``torch.cuda.synchronize``) is called after each run so GPU work counts.
    Returns ``{"median_ms", "min_ms", "repeats"}``.
    """
    for _ in range(warmup):
        fn()
    if sync:
        sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        if sync:
            sync()
        times.append((time.perf_counter() - start) * 1e3)
    return {"median_ms": statistics.median(times), "min_ms": min(times), "repeats": repeats}
