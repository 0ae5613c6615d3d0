"""bench/gpu_wan.py smoke-runs on CPU with tiny shapes (the GPU run uses the same code path)."""

from __future__ import annotations

import json

from worldstream.bench import gpu_wan


def test_tiny_run_reports_every_figure(tmp_path, capsys):
    out = tmp_path / "wan.json"
    assert gpu_wan.main(["--tiny", "--chunks", "2", "--steps", "1", "--json", str(out)]) == 0
    figures = json.loads(out.read_text())
    assert figures["frames_per_chunk"] == 12 and figures["tokens_per_frame"] == 16
    assert figures["attention_backend"] == "reference" and figures["fps"] > 0
    assert figures["time_to_first_frame_s"] > 0
    assert set(figures["stages_ms_median"]) == {"denoise", "cache_fill", "decode"}
    assert "fps, first frame" in capsys.readouterr().out


def test_real_shapes_are_wan_1_3b():
    cfg = gpu_wan.WAN_1_3B
    inner = cfg["num_attention_heads"] * cfg["attention_head_dim"]
    assert (inner, cfg["num_layers"], cfg["ffn_dim"], cfg["text_dim"]) == (1536, 30, 8960, 4096)
    args = gpu_wan.parse_args(["--device", "cpu"])
    assert (args.height, args.width, args.steps) == (480, 832, 4)
