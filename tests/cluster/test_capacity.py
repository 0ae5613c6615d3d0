"""The scale-out bench's arithmetic and reports (issue 55): the capacity model from a run's
figures, the README's generated table, and bad arguments refused before any host is made."""

from __future__ import annotations

import pytest

from worldstream.bench.cluster import capacity, scale_out


def _payload() -> dict:
    row = {"replicas": 1, "sessions": 4, "replicas_per_host": {"198.18.0.1": 1},
           "aggregate_fps": 64.0, "min_session_fps": 16.0, "a2f_p95_ms_median": 88.0,
           "frontend_core_per_session": 0.004}
    four = {**row, "replicas": 4, "sessions": 16, "aggregate_fps": 256.0,
            "replicas_per_host": {"198.18.0.1": 2, "198.18.0.2": 2}}
    return {"suite": "scale", "date": "2026-12-05T12:00:00Z",
            "command": "python -m bench scale --hosts 2", "hardware": {
                "cpu_model": "AMD EPYC", "cpu_cores": 2, "load_avg_1m_before": 4.0},
            "settings": {"fps": 16}, "ratio_4_vs_1": 4.0, "min_session_fps": 16.0,
            "frontend_core_per_session": 0.005, "frontend_core_per_session_before": 0.18,
            "rows": [row, four],
            "frontend": {"front": {"frontend_core_per_session": 0.18, "viewer_fps": [16, 15.5]},
                         "replica": {"frontend_core_per_session": 0.005,
                                     "viewer_fps": [16, 16]}},
            "host_loss": None}


def test_the_capacity_model_follows_the_measurements():
    c = capacity.model(_payload())
    assert c["sessions_per_frontend_core"] == 200  # 1 core / 0.005 core per session
    assert c["sessions_per_replica_832x480_model"] == 1  # one H100 per 832x480 session
    assert c["replicas_per_frontend_core_832x480"] == 200
    assert c["sessions_per_replica_128_measured_at_least"] == 4.0


def test_the_readme_block_is_regenerated_in_place(tmp_path):
    payload = _payload()
    payload["capacity"] = capacity.model(payload)
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{capacity.START}\nold\n{capacity.END}\nrest\n")
    capacity.update_readme(payload, readme)
    text = readme.read_text()
    assert text.startswith("intro\n") and text.endswith("rest\n") and "old" not in text
    assert "| aggregate fps, 4 vs 1 replicas | 4.0x | >= 3.5x |" in text
    assert "0.0050 (0.180 while delivering 15.5 fps)" in text
    assert "## Capacity model" in capacity.report(payload)
    readme.write_text("no block")
    with pytest.raises(ValueError, match="no <!-- bench:scale-hosts:start -->"):
        capacity.update_readme(payload, readme)


def test_a_ramp_run_keeps_the_committed_throughput_rows_and_adds_its_own(tmp_path,
                                                                       monkeypatch):
    """``--ramp --update-readme`` alone rewrites the table from the committed throughput run
    and its own ramp (both runs named); a throughput run alone keeps the committed ramp."""
    import json

    main = _payload()
    ramp = {"suite": "scale", "date": "2026-12-06T09:00:00Z",
            "command": "python -m bench scale --hosts 2 --ramp",
            "hardware": {"cpu_model": "AMD EPYC", "cpu_cores": 2, "load_avg_1m_before": 1.0},
            "ramp_settings": {"low": 2, "high": 16, "min_replicas": 1, "max_replicas": 4},
            "ramp_max_replicas": 4, "ramp_replicas_final": 1, "ramp_within_bounds": True,
            "ramp_sessions_dropped": 0, "ramp_moved": 3}
    monkeypatch.setattr(capacity, "MEASURED", tmp_path / "measured.json")
    monkeypatch.setattr(capacity, "MEASURED_RAMP", tmp_path / "measured_ramp.json")
    capacity.MEASURED.write_text(json.dumps(main))
    readme = tmp_path / "README.md"
    readme.write_text(f"{capacity.START}\n{capacity.END}\n")
    capacity.update_readme(ramp, readme)
    text = readme.read_text()
    assert "| aggregate fps, 4 vs 1 replicas | 4.0x | >= 3.5x |" in text
    assert "| 1 -> 4 -> 1 ([1, 4]: yes), 0 (3) | within bounds, 0 |" in text
    assert "`python -m bench scale --hosts 2` on" in text and "--ramp` on" in text
    capacity.MEASURED_RAMP.write_text(json.dumps(ramp))
    capacity.update_readme(main, readme)
    assert "0 (3)" in readme.read_text()


@pytest.mark.parametrize("argv", [["--hosts", "1"], ["--hosts", "2", "--replicas", "0,1"]])
def test_bad_counts_are_refused_before_any_host_is_made(argv):
    with pytest.raises(SystemExit, match="need --hosts >= 2"):
        scale_out.main(argv)
