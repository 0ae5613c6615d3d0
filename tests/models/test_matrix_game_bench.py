"""The Matrix-Game 2.0 benches smoke-run with tiny shapes on a CPU (the full-size and GPU runs
take the same code path): one chunk at the CPU, and the GPU script's figures."""

from __future__ import annotations

import json

from worldstream.bench import gpu_matrix_game, matrix_game_cpu


def test_cpu_smoke_run_reports_memory_and_seconds(tmp_path, capsys):
    out = tmp_path / "cpu.json"
    assert matrix_game_cpu.main(["--tiny", "--dtype", "float32", "--json", str(out)]) == 0
    figures = json.loads(out.read_text())
    assert figures["frames"] == [12, 32, 32, 3] and figures["steps"] == 3
    assert figures["chunk_s"] > 0 and figures["peak_rss_gib"] > 0
    assert set(figures["stages_ms"]) == {"denoise", "decode"}
    assert "one chunk of 12 frames" in capsys.readouterr().out


def test_gpu_script_reports_every_figure(tmp_path, monkeypatch):
    monkeypatch.setenv("OUT", str(tmp_path))
    assert gpu_matrix_game.main(["--tiny", "--compile", "off", "--chunks", "2",
                                 "--engine-s", "0.4", "--variants", "gta_drive"]) == 0
    (variant,) = json.loads((tmp_path / "gpu_matrix_game.json").read_text())["variants"]
    eager = variant["modes"]["eager"]
    assert variant["variant"] == "gta_drive" and variant["steps"] == 3
    assert eager["fps"] > 0 and eager["time_to_first_frame_s"] > eager["start_picture_s"] > 0
    assert eager["action_to_frame_ms"]["count"] >= 1
    assert set(eager["stages_ms_median"]) == {"denoise", "decode", "cache_fill"}
