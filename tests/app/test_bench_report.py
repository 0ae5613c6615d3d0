"""``python -m bench report`` on a tiny fixture: history rows plus saved runs in, the README's
table and ``bench/RESULTS.md`` out, with the rows worked out by hand."""

from __future__ import annotations

import json

import pytest

from worldstream.bench import report, results

HISTORY = {"rows": [
    {"date": "2026-01-01", "cpu": "CPU-A", "command": "python -m bench quick --threads 1",
     "world": "landscape", "model": "builtin", "steps": 4, "fps": 10.0, "p50_ms": 100.0},
    {"date": "2026-01-02", "cpu": "CPU-B", "command": "python -m bench quick --threads 1",
     "world": "landscape", "model": "builtin", "steps": 4, "fps": 12.0, "p50_ms": 90.0},
    {"date": "2026-01-02", "cpu": "CPU-B", "command": "python -m bench quick --steps 2",
     "world": "landscape", "model": "builtin", "steps": 2, "fps": 13.0, "p50_ms": 80.0},
    {"date": "2026-01-01", "cpu": "CPU-A", "command": "python -m bench quick --world avatar",
     "world": "avatar", "model": "builtin", "steps": 4, "fps": 20.0, "p50_ms": 50.0},
    # not a headline suite: only in the history
    {"date": "2026-01-05", "cpu": "CPU-A", "command": "python -m bench e2e --seconds 20",
     "world": "landscape", "model": "builtin", "steps": 2, "fps": 15.0, "p50_ms": 89.0,
     "latency": "action-to-photon"},
]}

# a saved run of the avatar, newer than the history's avatar row: it must win the headline
SAVED_QUICK = {"suite": "quick", "date": "2026-01-03T10:00:00Z",
               "command": "python -m bench quick --world avatar --threads 1", "fps": 25.0,
               "action_to_frame_ms_p50": 40.0, "action_to_frame_ms_p95": 60.0,
               "hardware": {"cpu_model": "TestCPU", "load_avg_1m": 1.0},
               "model": {"weights": "trained"}, "settings": {"world": "avatar", "steps": 4}}

README = "# title\n\nbefore\n\n" + report.START + "\nold table\n" + report.END + "\n\nafter\n"


@pytest.fixture
def fixture_dirs(tmp_path):
    history = tmp_path / "history.json"
    history.write_text(json.dumps(HISTORY))
    root = tmp_path / "results"
    results.save("quick", SAVED_QUICK, "# quick\n", root=root)
    return history, root


def test_headline_takes_the_latest_run_of_each_world_model_and_steps(fixture_dirs):
    history, root = fixture_dirs
    rows = report.all_rows(history, root)
    assert [r["date"][:10] for r in rows] == ["2026-01-01", "2026-01-01", "2026-01-02",
                                              "2026-01-02", "2026-01-03", "2026-01-05"]
    picked = [(r["world"], r["steps"], r["fps"], r["p50_ms"], r["cpu"])
              for r in report.headline(rows)]
    assert picked == [("landscape", 4, 12.0, 90.0, "CPU-B"),
                      ("landscape", 2, 13.0, 80.0, "CPU-B"),
                      ("avatar", 4, 25.0, 40.0, "TestCPU")]


def test_report_rewrites_only_the_marked_block_and_writes_the_history(fixture_dirs, tmp_path):
    history, root = fixture_dirs
    readme, results_md = tmp_path / "README.md", tmp_path / "RESULTS.md"
    readme.write_text(README)
    assert report.main(["--results", str(root), "--history", str(history),
                        "--results-md", str(results_md), "--readme", str(readme)]) == 0
    text = readme.read_text()
    assert text.startswith("# title\n\nbefore\n\n" + report.START + "\n")
    assert text.endswith(report.END + "\n\nafter\n") and "old table" not in text
    table_lines = [line for line in text.splitlines() if line.startswith("| ")]
    assert table_lines[1:] == [
        "| landscape | builtin | 4 | 12.0 | 90.0 | CPU-B | 2026-01-02 | "
        "`python -m bench quick --threads 1` |",
        "| landscape | builtin | 2 | 13.0 | 80.0 | CPU-B | 2026-01-02 | "
        "`python -m bench quick --steps 2` |",
        "| avatar | builtin | 4 | 25.0 | 40.0 | TestCPU | 2026-01-03 | "
        "`python -m bench quick --world avatar --threads 1` |"]
    page = results_md.read_text()
    # the history lists every row, newest first within its suite, the e2e row under its own
    quick = page.split("### `bench quick`")[1].split("###")[0]
    dates = [line.split(" | ")[0].strip("| ") for line in quick.splitlines()
             if line.startswith("| 2026")]
    assert dates == ["2026-01-03", "2026-01-02", "2026-01-02", "2026-01-01", "2026-01-01"]
    assert "### `bench e2e`" in page and "| 89.0 |" in page.split("### `bench e2e`")[1]
    assert "TestCPU" in page.split("## Latest saved runs")[1]
    # running it twice gives the same README (the block is replaced, not appended)
    assert report.main(["--results", str(root), "--history", str(history),
                        "--results-md", str(results_md), "--readme", str(readme)]) == 0
    assert readme.read_text() == text


def test_another_results_folder_leaves_the_repository_pages_alone(fixture_dirs, monkeypatch,
                                                                  tmp_path):
    _, root = fixture_dirs
    monkeypatch.setattr(report, "README", tmp_path / "repo_README.md")
    monkeypatch.setattr(report, "RESULTS_MD", tmp_path / "repo_RESULTS.md")
    assert report.main(["--results", str(root)]) == 0
    assert (root / "PERFORMANCE.md").is_file()
    assert not (tmp_path / "repo_README.md").exists()
    assert not (tmp_path / "repo_RESULTS.md").exists()


def test_bad_history_and_missing_markers_are_refused(tmp_path):
    bad = tmp_path / "h.json"
    bad.write_text(json.dumps({"rows": [{"date": "2026-01-01", "cpu": "x"}]}))
    with pytest.raises(ValueError, match="row 0 has no command"):
        report.load_history(bad)
    with pytest.raises(ValueError, match="markers"):
        report.replace_between("no markers here", "x")


def test_the_committed_history_is_valid_and_names_each_world():
    rows = report.all_rows(report.HISTORY, report.HISTORY.parent / "no-such-results")
    top = {(r["world"], r.get("steps")): r for r in report.headline(rows)}
    assert top[("landscape", 4)]["fps"] == 15.8 and top[("avatar", 4)]["fps"] == 21.2
    assert all(r["cpu"] for r in rows)


def test_game_section_marks_each_goal_against_its_threshold(tmp_path):
    """One shipped world and one measured game: every goal row is there, a value past its
    goal is marked a miss and one within it is not; the rollout goals compare against the
    game's own copy-last baseline."""
    from worldstream.bench.report_games import GOALS, load_games, render_games

    ev = {"env": "ALE/Pong-v5", "changed_psnr_db": 31.0, "gt_changed_psnr_db": 99.0,
          "rollout_psnr_db_16": 33.0, "copylast_psnr_db_16": 31.5,  # +1.5 dB: a miss
          "rollout_psnr_db_64": 30.0, "copylast_psnr_db_64": 29.0,
          "action_effect_corr": 0.95, "gt_action_effect_corr": 1.0,
          "action_effect_corr_4": 0.5, "gt_action_effect_corr_4": 1.0,  # a miss
          "off_palette_share": 0.0, "gt_off_palette_share": 0.0,
          "change_rate_ratio": 2.5, "gt_change_rate_ratio": 1.0}  # a miss
    shipped = tmp_path / "assets" / "pong"
    shipped.mkdir(parents=True)
    (shipped / "world.json").write_text("{}")
    (shipped / "eval.json").write_text(json.dumps(ev))
    (shipped / "training.json").write_text(json.dumps(
        {"train_seconds": 1800, "config": {"steps": 10, "batch": 2, "threads": 2}}))
    measured = tmp_path / "games"
    measured.mkdir()
    (measured / "crafter.json").write_text(json.dumps(
        {"eval": {**ev, "env": "CrafterReward-v1"}, "date": "2026-12-05T10:00:00Z",
         "cpu": "test cpu"}))
    games = load_games(tmp_path / "assets", measured)
    assert list(games) == ["pong", "crafter"]
    text = render_games(games)
    rows = {line.split(" | ")[0].strip("| "): line for line in text.splitlines()
            if line.startswith("| ")}
    for label, *_ in GOALS:
        assert label in rows
    assert "30 min (10 steps x 2, 2 thread(s))" in rows["training wall time"]
    missed = {label for label in rows if "**miss**" in rows[label]}
    assert missed == {"free-rollout PSNR at 16 frames (dB)",
                      "action effect, 4 frames after (corr)",
                      "free-play change rate vs the env's (x)"}
    assert "bench/games/crafter.json (2026-12-05, test cpu)" in text
