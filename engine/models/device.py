"""What the machine a model runs on can do: the one place serving, training and evaluation
ask it."""

from __future__ import annotations

import functools
from pathlib import Path


@functools.cache
def cpu_has_fast_bf16() -> bool:
    """Whether this CPU computes bf16 natively (AVX512-BF16 or AMX flags in /proc/cpuinfo)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


#: the most torch threads a setting may ask (libgomp aborts the process far above a
#: machine's cores: ``cpu_threads=100000``)
MAX_CPU_THREADS = 256


def device_problem(name: object) -> str | None:
    """What is wrong with a torch device name on this machine (None: it can be used):
    not a device torch knows (``zzz``), or a kind this machine lacks (``cuda`` without a
    GPU, ``cuda:3`` on a machine with one)."""
    import torch

    try:
        device = torch.device(str(name))
    except (RuntimeError, ValueError, TypeError):
        return f"is not a torch device, got {name!r}"
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if (device.index or 0) >= count:
            return f"{name!r} is not on this machine ({count} CUDA devices)"
    elif device.type == "mps":
        if not torch.backends.mps.is_available():
            return f"{name!r} is not on this machine"
    elif device.type != "cpu":
        return f"{name!r}: only cpu, cuda and mps devices are served"
    return None
