"""bench/gpu_wan.py smoke-runs on CPU with tiny shapes (the GPU run uses the same code path)."""

from __future__ import annotations

import json

import pytest

from worldstream.bench import gpu_wan


def test_tiny_run_reports_every_figure(tmp_path, capsys):
    out = tmp_path / "wan.json"
    assert gpu_wan.main(["--tiny", "--chunks", "2", "--steps", "1", "--json", str(out)]) == 0
    figures = json.loads(out.read_text())
    assert figures["frames_per_chunk"] == 12 and figures["tokens_per_frame"] == 16
    assert figures["attention_backend"] == "reference" and figures["fps"] > 0
    assert figures["time_to_first_frame_s"] > 0
    # the chunk's stages are parts of its wall time: their medians cannot exceed the whole
    # chunk's median by more than rounding (each stage is timed inside the chunk)
    assert sum(figures["stages_ms_median"].values()) <= 1.5 * figures["chunk_ms_median"] + 1
    # fps is frames over wall time: one chunk's frames in about the median chunk time
    assert figures["fps"] == pytest.approx(12 / (figures["chunk_ms_median"] / 1e3), rel=0.5)
    assert set(figures["stages_ms_median"]) == {"denoise", "cache_fill", "decode"}
    assert "fps, first frame" in capsys.readouterr().out


def test_real_shapes_are_wan_1_3b():
    cfg = gpu_wan.WAN_1_3B
    inner = cfg["num_attention_heads"] * cfg["attention_head_dim"]
    assert (inner, cfg["num_layers"], cfg["ffn_dim"], cfg["text_dim"]) == (1536, 30, 8960, 4096)
    args = gpu_wan.parse_args(["--device", "cpu"])
    assert (args.height, args.width, args.steps) == (480, 832, 4)
