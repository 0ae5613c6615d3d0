"""The attention benchmarks import, parse their arguments and build correct plans on CPU."""

import torch

import worldstream.bench.__main__ as bench_main
from worldstream.bench import attention, gpu_attention
from worldstream.bench.common import hardware_info, time_call


def test_dispatcher_lists_suites_and_rejects_unknown(capsys):
    assert bench_main.SUITES["attention"] == "worldstream.bench.attention"
    assert bench_main.main(["no-such-suite"]) == 2
    assert "attention" in capsys.readouterr().out


def test_hardware_info_and_timer():
    info = hardware_info()
    assert info["torch"] == torch.__version__ and info["cpu_cores"] >= 1
    calls = []
    timing = time_call(lambda: calls.append(1), warmup=2, repeats=3)
    assert len(calls) == 5 and timing["repeats"] == 3 and timing["min_ms"] >= 0


def test_gpu_attention_dry_run_plan(capsys):
    assert gpu_attention.main(["--dry-run"]) == 0
    out = capsys.readouterr().out
    # dense: 3 query frames x 21 KV frames of 1560 tokens, 4 * 12 heads * 128 dims per pair
    assert f"{4 * 12 * 128 * 3 * 21 * 1560 * 1560 / 1e9:.1f} GFLOP" in out
    cases = {c.name: c for c in gpu_attention.build_cases(gpu_attention.parse_args([]))}
    assert cases["frames"].lists[0] == [0, 1, 2] + list(range(12, 21))
    # a query band sees all 9 bands of the chunk plus <= 3 bands of each of 9 older kept frames
    assert all(9 + 9 * 2 <= len(pages) <= 9 + 9 * 3 for pages in cases["tiles"].lists)


def test_gpu_attention_cpu_smoke_with_reference(capsys):
    argv = [
        "--device",
        "cpu",
        "--dtype",
        "fp32",
        "--tokens-per-frame",
        "48",
        "--heads",
        "2",
        "--head-dim",
        "16",
        "--kv-frames",
        "5",
        "--sink-frames",
        "1",
        "--window-frames",
        "3",
        "--backends",
        "reference",
        "--repeats",
        "1",
        "--warmup",
        "0",
    ]
    assert gpu_attention.main(argv) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if "max err" in line]
    errors = [float(line.split("max err ")[1].split(")")[0]) for line in lines]
    assert len(errors) == 6 and max(errors) < 1e-4
    # the paged backend runs on a plan made once (as the engine's layers do); SDPA has none
    assert all(("plan " in line) == (" reference " in line) for line in lines)


def test_attention_bench_dense_mask_matches_lists():
    table = [7, 3, 9]
    mask = attention._dense_mask(table, [[7, 9], [3]])
    assert mask.shape == (1, 1, 128, 3 * 64)
    assert mask[0, 0, :64, :64].all() and not mask[0, 0, :64, 64:128].any()
    assert mask[0, 0, :64, 128:].all() and mask[0, 0, 64:, 64:128].all()
    assert not mask[0, 0, 64:, :64].any() and not mask[0, 0, 64:, 128:].any()

