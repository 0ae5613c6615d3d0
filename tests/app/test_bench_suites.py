"""The benchmark suites' core computations on tiny inputs with hand-worked answers (percentiles,
action matching, memory growth, trend detection, RTP matching, export analysis, report
rendering), and the quick suite end to end on a tiny random model. No timing assertions."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worldstream.bench import analyse, e2e_analysis, e2e_client, report, results, soak
from worldstream.bench.stats import match_actions, relative_growth, summarize, trend
from worldstream.bench.streams import SessionRun


# ----------------------------------------------------------------------------- stats
def test_summarize_known_percentiles():
    s = summarize(range(1, 101))
    # numpy linear interpolation: p at rank (n - 1) * p / 100 over 1..100
    assert s["p50"] == pytest.approx(50.5)
    assert s["p95"] == pytest.approx(95.05)
    assert s["p99"] == pytest.approx(99.01)
    assert (s["count"], s["min"], s["max"], s["mean"]) == (100, 1, 100, 50.5)


def test_summarize_empty_and_invalid():
    assert summarize([]) == {"count": 0, "mean": None, "min": None, "max": None,
                             "p50": None, "p95": None, "p99": None}
    with pytest.raises(ValueError):
        summarize([1.0, float("nan")])


def test_match_actions_hand_worked():
    # actions 1 @10, 2 @20, 3 @50; frames (action_seq, t)
    frames = [(0, 5), (0, 15), (1, 18), (2, 30), (2, 40)]
    lat = match_actions([1, 2, 3], [10, 20, 50], [f[0] for f in frames], [f[1] for f in frames])
    assert lat[0] == 8 and lat[1] == 10 and np.isnan(lat[2])


def test_match_actions_superseded_and_early_frames():
    # action 2 supersedes 1 before any frame: the frame conditioned on 2 answers both
    lat = match_actions([1, 2], [10, 12], [2], [20])
    assert list(lat) == [10, 8]
    # a frame stamped before the action (other clock) never answers it
    lat = match_actions([1], [30], [1, 1], [25, 35])
    assert list(lat) == [5]
    with pytest.raises(ValueError):
        match_actions([1], [1, 2], [], [])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 200)), max_size=30),
       st.lists(st.tuples(st.integers(1, 8), st.integers(0, 200)), max_size=10))
def test_match_actions_equals_brute_force(frame_steps, actions):
    # frames in time order with non-decreasing action_seq (what a stream produces)
    t, seq, f_t, f_seq = 0, 0, [], []
    for dseq, dt in frame_steps:
        t += dt
        seq += dseq
        f_t.append(t)
        f_seq.append(seq)
    lat = match_actions([a[0] for a in actions], [a[1] for a in actions], f_seq, f_t)
    for (s, ta), got in zip(actions, lat, strict=True):
        hits = [tf for sf, tf in zip(f_seq, f_t, strict=True) if sf >= s and tf >= ta]
        expected = min(hits) - ta if hits else np.nan
        assert (np.isnan(got) and np.isnan(expected)) or got == expected


def test_relative_growth():
    assert relative_growth([90, 100, 100, 100, 106, 106, 106]) == pytest.approx(0.06)
    assert relative_growth([50, 100, 100, 100, 100]) == 0.0
    # one spike in the last window does not count (median)
    assert relative_growth([100, 100, 100, 100, 100, 300, 100]) == 0.0
    with pytest.raises(ValueError):
        relative_growth([100, 100])


def test_trend_detects_a_real_rise_only():
    rng = np.random.default_rng(0)
    t = np.arange(20.0)
    flat = 100 + rng.normal(0, 5, 20)
    assert not trend(t, flat)["upward"]
    ramp = np.linspace(100, 150, 20) + rng.normal(0, 2, 20)
    r = trend(t, ramp)
    assert r["upward"] and r["slope"] == pytest.approx(50 / 19, rel=0.2)
    assert not trend(t, ramp[::-1])["upward"]
    # significant but small (1% over the run): below the 10% threshold
    assert not trend(t, np.linspace(100, 101, 20))["upward"]
    assert not trend([0, 1], [1, 5])["upward"]


# ----------------------------------------------------------------------------- streams
def _frame(action_seq, t_ns, stages=None):
    return SimpleNamespace(action_seq=action_seq, t_ready_ns=t_ns,
                           stages_ms=stages or {"denoise": 1.0})


def test_session_run_fps_and_latency():
    run = SessionRun("s", created_ns=0)
    ms = 1_000_000
    for k in range(4):  # chunks of 2 frames every 100 ms from t = 200 ms
        for _ in range(2):
            run.add(_frame(1 if k >= 1 else -1, (200 + 100 * k) * ms, {"denoise": float(k)}))
    run.action_seq, run.action_ns = [1], [250 * ms]
    assert run.fps() == pytest.approx(6 / 0.3)  # 6 frames after the first chunk over 300 ms
    assert list(run.latencies_ms()) == [50.0]
    s = run.summary()
    assert s["ttff_ms"] == 200 and s["frames"] == 8
    assert s["stages_ms"]["denoise"] == pytest.approx(1.5)  # median of 0, 1, 2, 3


# ----------------------------------------------------------------------------- soak
def _samples(rss, p50):
    return [{"t_s": 60.0 * (i + 1), "rss_mib": r, "latency_ms": {"p50": p}}
            for i, (r, p) in enumerate(zip(rss, p50, strict=True))]


def test_soak_verdict():
    ok = soak.verdict(_samples([500, 600, 601, 600, 602, 601, 603], [100] * 7))
    assert ok["passed"] and ok["reasons"] == []
    leak = soak.verdict(_samples([500, 600, 600, 600, 640, 660, 680], [100] * 7))
    assert not leak["passed"] and "resident memory grew" in leak["reasons"][0]
    slow = soak.verdict(_samples([600] * 10, [100, 100, 110, 120, 130, 140, 150, 160, 170, 180]))
    assert not slow["passed"] and "trends upward" in slow["reasons"][0]
    with pytest.raises(ValueError):
        soak.verdict(_samples([1, 2], [1, 2]))


def test_rss_bytes_is_plausible():
    assert 10 * 2**20 < soak.rss_bytes() < 64 * 2**30


# ----------------------------------------------------------------------------- e2e
def test_rtp_offset_and_jitter():
    # the pacer skipped tick 2 (an engine stall); aiortc rebases timestamps on the first
    # packet received, and frame 0 was lost: 4500 arrives as 0
    sent = [0, 4500, 13500, 18000]
    received = [0, 9000, 13500]
    c = e2e_analysis.rtp_offset(received, sent)
    assert [(p - c) % e2e_analysis.RTP_MOD for p in received] == [4500, 13500, 18000]
    # evenly paced and nothing lost: ambiguous shifts resolve to 0
    assert e2e_analysis.rtp_offset([0, 4500, 9000], [0, 4500, 9000, 13500]) == 0
    assert e2e_analysis.rtp_offset([], sent) is None
    j = e2e_analysis.jitter_ms([0, 50, 100, 150, 200], fps=20)
    assert j == {"std_ms": 0.0, "p95_abs_dev_ms": 0.0}


def test_analyse_log_hand_worked():
    log = e2e_client.ClientLog()
    # frames every 50 ms (fps 20); frame k has rtp 4500 k; action 1 sent at 120 ms is in the
    # metadata of frames from index 3 on; frame 2 never arrives (dropped)
    for k in range(6):
        log.messages.append({"type": "frame", "index": k, "rtp_ts": 4500 * k,
                             "action_seq": 1 if k >= 3 else -1,
                             "stages_ms": {"denoise": 10.0}, "queue_ms": 5.0,
                             "t_recv_ms": 50.0 * k})
        if k != 2:  # aiortc's encoder rounds some timestamps by a tick
            log.frames.append((4500 * k - (k == 4), 50.0 * k + 7))
    log.actions.append({"seq": 1, "t_ms": 120.0, "keys": ["up"]})
    res = e2e_analysis.analyse_log(log, fps=20, warmup_s=0)
    assert res["action_to_photon_ms"]["p50"] == pytest.approx(157 - 120)
    assert res["dropped_frames"] == 1 and res["frames_generated"] == 6
    assert res["stages_ms"]["encode_transport"] == pytest.approx(7)
    assert res["stages_ms"]["server_queue"] == 5.0
    export = e2e_analysis.to_export(log)
    assert export == [{"action_seq": 1, "t_action_ms": 120.0, "keys": ["up"],
                       "t_photon_ms": 157.0, "frame_index": 3, "stages_ms": {"denoise": 10.0}}]
    assert analyse.load_export(export)[1] == export  # e2e writes the documented format


def test_random_script_is_seeded_and_bounded():
    a, b = e2e_client.random_script(10, seed=3), e2e_client.random_script(10, seed=3)
    assert a == b and all(0 < s["t_s"] < 10 for s in a)
    gaps = np.diff([s["t_s"] for s in a])
    assert np.all((gaps >= 0.3 - 1e-3) & (gaps <= 1.0 + 1e-3))


# ----------------------------------------------------------------------------- analyse
EXPORT = {"meta": {"browser": "test"}, "actions": [
    {"action_seq": 1, "t_action_ms": 1000.0, "t_photon_ms": 1100.0, "stages_ms": {"decode": 4}},
    {"action_seq": 2, "t_action_ms": 2000.0, "t_photon_ms": 2300.0, "stages_ms": {"decode": 6}},
    {"action_seq": 3, "t_action_ms": 3000.0, "t_photon_ms": 3200.0},
    {"action_seq": 4, "t_action_ms": 4000.0, "t_photon_ms": None},
]}


def test_analyse_hand_made_export():
    meta, actions = analyse.load_export(EXPORT)
    res = analyse.analyse(actions)
    assert meta == {"browser": "test"}
    assert res["latency_ms"]["p50"] == 200 and res["latency_ms"]["max"] == 300
    assert (res["answered"], res["unanswered"], res["duration_s"]) == (3, 1, 3.0)
    assert res["stages_ms"] == {"decode": 5.0}


@pytest.mark.parametrize("bad, message", [
    ({"x": 1}, "actions"),
    ([{"action_seq": 1, "t_action_ms": 5}], "missing 't_photon_ms'"),
    ([{"action_seq": True, "t_action_ms": 5, "t_photon_ms": 6}], "action_seq"),
    ([{"action_seq": 1, "t_action_ms": 5, "t_photon_ms": 4}], "before"),
    ([{"action_seq": 1, "t_action_ms": "5", "t_photon_ms": 6}], "t_action_ms"),
])
def test_analyse_rejects_bad_exports(bad, message):
    with pytest.raises(analyse.ExportError, match=message):
        analyse.load_export(bad)


def test_analyse_cli_writes_plots(tmp_path, capsys):
    path = tmp_path / "session.json"
    path.write_text(json.dumps(EXPORT))
    assert analyse.main([str(path), "--out", str(tmp_path / "out")]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["analysis"]["latency_ms"]["p95"] == pytest.approx(290)  # 200 + .9 * (300 - 200)
    for name in ("result.json", "result.md", "histogram.png", "over_time.png", "stages.png"):
        assert (tmp_path / "out" / name).stat().st_size > 0
    bad = tmp_path / "bad.json"
    bad.write_text("[1]")
    assert analyse.main([str(bad), "--out", str(tmp_path / "o2")]) == 2


# ----------------------------------------------------------------------------- report
def test_report_headline_rows_and_render(tmp_path):
    quick = {"date": "D", "command": "c", "fps": 25.0, "ttff_ms": 600.0,
             "action_to_frame_ms_p50": 150.0, "action_to_frame_ms_p95": 250.0,
             "speedup_vs_recompute": 4.0, "sparse_vs_dense_speed": 1.5,
             "batched_2_sessions_aggregate_ratio": 1.7,
             "hardware": {"cpu_model": "TestCPU", "cpu_cores": 2}, "model": {"weights": "random"}}
    rows = {r[0]: r for r in report.headline_rows({"quick": quick})}
    assert rows["fps, one session, with decoding"][3] == "yes"
    assert rows["time to first frame (ms)"][3] == "**no**"
    assert rows["KV cache vs naive recompute (x)"][3] == "**no**"
    assert rows["2 sessions batched, aggregate vs one (x)"][3] == "yes"
    assert rows["resident memory growth over the soak (%)"][3] == "not run"
    (tmp_path / "quick").mkdir()
    (tmp_path / "quick" / "result.json").write_text(json.dumps(quick))
    assert report.main(["--results", str(tmp_path)]) == 0
    text = (tmp_path / "PERFORMANCE.md").read_text()
    assert "TestCPU" in text and "Not run yet: engine, baselines, e2e, scale, soak" in text


def test_results_table_and_save(tmp_path):
    assert results.table(["a", "b"], [[1.234, None], [True, "x"]], 2) == (
        "| a | b |\n|---|---|\n| 1.23 | — |\n| yes | x |\n")
    payload = results.stamp_payload("demo", {"x": 1}, ["--flag"])
    assert payload["command"] == "python -m bench demo --flag" and payload["x"] == 1
    folder = results.save("demo", payload, "# demo\n", root=tmp_path)
    assert results.load_latest("demo", tmp_path) == payload
    assert (folder / "result.md").read_text() == "# demo\n"
    assert len(list((folder / "history").iterdir())) == 1


# ----------------------------------------------------------------------------- quick
def test_model_for_chunk_keeps_weights():
    import torch

    from worldstream.bench.harness import load_models, model_for_chunk

    models = load_models("random", smoke=True)
    copy = model_for_chunk(models.model, 4)
    assert copy.config.chunk_frames == 4 and models.model.config.chunk_frames == 1
    for (name, a), (_, b) in zip(models.model.state_dict().items(),
                                 copy.state_dict().items(), strict=True):
        assert torch.equal(a, b), name


@pytest.mark.slow
def test_quick_smoke_reports_every_key(tmp_path, capsys):
    import torch

    from worldstream.bench import quick

    out = tmp_path / "quick.json"
    threads = torch.get_num_threads()
    try:
        assert quick.main(["--smoke", "--threads", "1", "--seconds", "2", "--steps", "1",
                           "--context-frames", "4", "--memory-frames", "8", "--no-save",
                           "--json", str(out)]) == 0
    finally:
        torch.set_num_threads(threads)
    printed = json.loads(out.read_text())
    assert json.loads(capsys.readouterr().out) == printed  # one JSON object on stdout
    for key in ("fps", "ttff_ms", "action_to_frame_ms_p50", "action_to_frame_ms_p95",
                "speedup_vs_recompute", "sparse_vs_dense_speed",
                "batched_2_sessions_aggregate_ratio", "hardware", "model", "settings",
                "weights", "resolution"):
        assert key in printed, key
    assert printed["weights"] == "random" and printed["resolution"] == "128x128"
    assert printed["fps"] > 0 and printed["ttff_ms"] > 0
    # the headline ratios are the ratios of the timings reported beside them
    details = printed["details"]
    recompute, sparse = details["kv_cache_vs_recompute"], details["sparse_vs_dense"]
    assert printed["speedup_vs_recompute"] == pytest.approx(
        recompute["naive_chunk_ms"] / recompute["cached_chunk_ms"], rel=1e-6)
    assert printed["sparse_vs_dense_speed"] == pytest.approx(
        sparse["dense_chunk_ms"] / sparse["sparse_chunk_ms"], rel=1e-6)
    assert printed["action_to_frame_ms_p50"] <= printed["action_to_frame_ms_p95"]
    assert printed["hardware"]["torch_threads"] == 1
    assert printed["details"]["kv_cache_vs_recompute"]["context_frames"] == 4


def test_bench_dispatcher_lists_the_suites(capsys):
    from worldstream.bench.__main__ import SUITES, main

    for suite in ("quick", "engine", "baselines", "e2e", "soak", "scale", "report", "analyse"):
        assert suite in SUITES
    assert main(["nope"]) == 2


def test_gpu_train_refuses_incomplete_arguments_before_recording(tmp_path):
    """``python -m bench gpu_train`` needs ``--out`` and ``--minutes`` (or only writes a text
    table) and refuses a bad time split, before any data is recorded."""
    import pytest

    from worldstream.bench import gpu_train

    data = tmp_path / "data"
    for argv in (["--minutes", "1"], ["--out", str(tmp_path / "o")],
                 ["--out", str(tmp_path / "o"), "--minutes", "0"],
                 ["--out", str(tmp_path / "o"), "--minutes", "1", "--ae-share", "1.5"]):
        with pytest.raises(SystemExit):
            gpu_train.main([*argv, "--data", str(data)])
    assert not data.exists()


@pytest.mark.slow
def test_gpu_train_prepares_then_fine_tunes_on_the_cached_latents(tmp_path):
    """The GPU lease's path on tiny avatar shards: ``--prepare-only`` records nothing already
    recorded, encodes the latents and stops at step 0; the fine-tune after ``--`` resumes on
    those caches (not encoded again), and its weights load as the model it was asked for."""
    import json

    from worldstream.bench import gpu_train
    from worldstream.engine.models.builtin.world_dit import WorldDiT
    from worldstream.engine.training.avatar_data import NUM_SHARDS
    from worldstream.engine.worlds.avatar.recorder import record_shard

    data = tmp_path / "data"
    for k in range(NUM_SHARDS):
        record_shard(data / f"shard{k}", [10_000 + k], 6)
    record_shard(data / "ae_heldout", [900_000], 6)
    out = tmp_path / "out"
    tune = ["--preset", "avatar-v2.7", "--set", "init_from=assets/avatar/transformer",
            "--set", "batch=2", "--set", "frames=4", "--set", "steps=2"]
    common = ["--world", "avatar", "--data", str(data), "--out", str(out)]
    assert gpu_train.main([*common, "--prepare-only", "--", *tune]) == 0
    run = out / "runs" / "world"
    cached = [(run / f).stat().st_mtime_ns for f in ("latents.pt", "latents_warped.pt")]
    assert json.loads((run / "world_result.json").read_text())["steps"] == 0
    assert gpu_train.main([*common, "--minutes", "5", "--", *tune]) == 0
    assert [(run / f).stat().st_mtime_ns for f in ("latents.pt", "latents_warped.pt")] == cached
    assert json.loads((run / "world_result.json").read_text())["steps"] == 2
    model = WorldDiT.from_pretrained(out / "transformer")
    assert model.config.depth == 4 and model.config.num_actions > 9  # the avatar's actions
    assert model.config.pose_path == "head_rig_fit"
