"""The Triton backend equals the reference: on CPU through the interpreter in a subprocess
(small fp32 shapes), natively on a CUDA GPU when one is present."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings

from tests.fixtures.kernels import paged_cases

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
HAS_GPU = torch.cuda.is_available()
DEVICE = "cuda" if HAS_GPU and not INTERPRETED else "cpu"
NO_TRITON_REASON = (
    "no CUDA GPU and TRITON_INTERPRET!=1 (the interpreted run happens in "
    "test_triton_interpreted_in_subprocess)"
)


def _compare(case, atol):
    out = case.run("triton")
    expected = case.to(case.q.device, torch.float32).run("reference")
    assert out.dtype == case.q.dtype
    torch.testing.assert_close(out.float(), expected, atol=atol, rtol=atol)


@pytest.mark.skipif(not (INTERPRETED or HAS_GPU), reason=NO_TRITON_REASON)
@settings(max_examples=25 if INTERPRETED else 100, deadline=None)
@given(case=paged_cases(q_block_sizes=(16, 32, 64), device=DEVICE))
def test_triton_equals_reference_fp32(case):
    _compare(case, atol=1e-5)


@pytest.mark.skipif(
    not HAS_GPU,
    reason="no CUDA GPU: bf16 Triton needs real hardware "
    "(the interpreter's bf16 tl.dot is wrong in Triton 3.9)",
)
@settings(max_examples=100, deadline=None)
@given(case=paged_cases(dtype=torch.bfloat16, device="cuda"))
def test_triton_equals_reference_bf16_gpu(case):
    _compare(case, atol=2e-2)


@pytest.mark.slow
@pytest.mark.skipif(INTERPRETED, reason="already inside the interpreted run")
def test_triton_interpreted_in_subprocess():
    # TRITON_INTERPRET must be set before triton compiles anything, so a fresh process is used.
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            f"{Path(__file__).resolve().relative_to(root)}::test_triton_equals_reference_fp32",
        ],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "1 passed" in result.stdout, result.stdout[-3000:]
