"""The autoscaling ramp's schedule and the reading of its trace (issue 55), on a trace worked
out by hand: no Ray."""

from __future__ import annotations

import pytest

from worldstream.bench.cluster.ramp_trace import analyse, stalls, target_sessions

T = [0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0]
SESSIONS = [2, 3, 4, 4, 3, 2, 2, 3, 3]
REPLICAS = [1, 2, 2, 3, 3, 2, 2, 1, 1]
FRAMES = {  # per sample; missing: not open, None: not reported yet
    "a": [None, 3, 6, 9, 1, 4, 7, 10, 13],  # moved at 2.0 (the count starts afresh): fine
    "b": [None, 0, 2, 2, 2, None, None, None, None],  # frames stop at 1.0, closed at 2.1
    "c": [None, None, None, 3, 6, None, None, None, None],  # opened 0.9, closed 2.4: fine
    "d": [None, None, None, 1, 2, 3, 4, 5, 6],  # frames flow, but an error at 3.2
    "e": [None] * 7 + [0, 0],  # opened 3.0, never a frame
}
RECORDS = {"a": {"opened": 0.0, "closed": None, "error": None},
           "b": {"opened": 0.4, "closed": 2.1, "error": None},
           "c": {"opened": 0.9, "closed": 2.4, "error": None},
           "d": {"opened": 0.9, "closed": None, "error": 3.2},
           "e": {"opened": 3.0, "closed": None, "error": None}}


def _samples() -> list[dict]:
    return [{"t": t, "sessions": n, "replicas": r, "draining": 0, "per_replica": [],
             "frames": {sid: counts[i] for sid, counts in FRAMES.items()}}
            for i, (t, n, r) in enumerate(zip(T, SESSIONS, REPLICAS, strict=True))]


def test_the_schedule_rises_holds_and_falls_evenly():
    kw = {"low": 2, "high": 16, "up_s": 14.0, "hold_s": 6.0, "down_s": 14.0}
    assert [target_sessions(t, **kw) for t in (0, 7, 13.99, 14, 19.9, 20, 27, 34, 99)] == \
        [2, 9, 15, 16, 16, 16, 9, 2, 2]


def test_each_sessions_longest_time_without_a_frame_while_open():
    # at the samples' resolution: a frame first seen at the first sample after the opening
    # is no stall (c, d: 0.1 s from opening to a sample without one)
    assert stalls(_samples(), RECORDS, end_s=4.0 + 1e-9) == {
        "a": 0.0, "b": 1.0, "c": 0.1, "d": 0.1, "e": 1.0}


def test_the_trace_reads_bounds_scale_down_and_dropped_sessions():
    out = analyse(_samples(), RECORDS, min_replicas=1, max_replicas=3, down_end_s=3.0,
                  stall_s=1.0)
    assert out["ramp_replicas_trace"][:3] == [[0.0, 2, 1], [0.5, 3, 2], [1.0, 4, 2]]
    assert len(out["ramp_replicas_trace"]) == 9
    assert out["ramp_max_replicas"] == 3
    assert out["ramp_min_replicas_after"] == 1 and out["ramp_replicas_final"] == 1
    assert out["ramp_s_to_min"] == 0.5  # 1 replica first seen at 3.5
    assert out["ramp_within_bounds"] is True
    # b's frames stopped before it was closed, d errored, e never started
    assert out["ramp_dropped_ids"] == ["b", "d", "e"] and out["ramp_sessions_dropped"] == 3
    assert out["ramp_max_frame_stall_s"] == 1.0
    tight = analyse(_samples(), RECORDS, min_replicas=2, max_replicas=2, down_end_s=3.0,
                    stall_s=1.0)
    assert tight["ramp_within_bounds"] is False and tight["ramp_s_to_min"] == 0.0


def test_an_empty_trace_is_an_error():
    with pytest.raises(ValueError, match="empty"):
        analyse([], {}, min_replicas=1, max_replicas=2, down_end_s=0.0, stall_s=1.0)
