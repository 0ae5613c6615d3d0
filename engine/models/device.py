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
