"""The numbers behind every benchmark verdict: percentiles, action-to-frame matching, memory
growth and latency trend detection. Pure numpy/scipy on plain sequences (no torch, no engine),
so each is tested on synthetic data with known answers.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy import stats as sps

PERCENTILES = (50, 95, 99)


def summarize(values: Sequence[float]) -> dict:
    """``{"count", "mean", "min", "max", "p50", "p95", "p99"}`` of ``values`` (any unit).

    Percentiles use numpy's default linear interpolation. An empty input gives ``count`` 0 and
    None everywhere else (a run that measured nothing must not look like 0 ms).
    """
    arr = np.asarray(values, dtype=float)
    if arr.size == 0:
        return {"count": 0, "mean": None, "min": None, "max": None,
                **{f"p{p}": None for p in PERCENTILES}}
    if not np.all(np.isfinite(arr)):
        raise ValueError("values must be finite")
    out = {"count": int(arr.size), "mean": float(arr.mean()), "min": float(arr.min()),
           "max": float(arr.max())}
    out.update({f"p{p}": float(np.percentile(arr, p)) for p in PERCENTILES})
    return out


def match_actions(action_seqs: Sequence[int], action_times: Sequence[float],
                  frame_action_seqs: Sequence[int], frame_times: Sequence[float]) -> np.ndarray:
    """Latency from each action to the first frame conditioned on it.

    A frame carries the newest action sequence number it was conditioned on (PROTOCOL.md);
    an action ``s`` is answered by the first frame, in time order, whose ``action_seq >= s``
    and whose time is not before the action (a later action supersedes an earlier one: its
    frames answer both, as the held-keys protocol means). Times share one unit and clock.

    Returns a float array aligned with ``action_seqs``: ``frame_time - action_time``, NaN for
    an action no frame answered (the stream ended first). ValueError on length mismatches.
    """
    a_seq = np.asarray(action_seqs, dtype=np.int64)
    a_t = np.asarray(action_times, dtype=float)
    f_seq = np.asarray(frame_action_seqs, dtype=np.int64)
    f_t = np.asarray(frame_times, dtype=float)
    if a_seq.shape != a_t.shape or f_seq.shape != f_t.shape:
        raise ValueError("each sequence needs a time of the same length")
    out = np.full(a_seq.shape, np.nan)
    if f_seq.size == 0:
        return out
    order = np.argsort(f_t, kind="stable")
    f_t = f_t[order]
    # running max: "some frame up to here answered seq s" is monotonic in time
    answered = np.maximum.accumulate(f_seq[order])
    for i, (seq, t) in enumerate(zip(a_seq, a_t, strict=True)):
        j = max(np.searchsorted(answered, seq, side="left"),
                np.searchsorted(f_t, t, side="left"))
        # frames after j may still carry an older seq only if the stream reordered; the
        # running max makes any index >= the first answering one valid
        if j < f_t.size and answered[j] >= seq:
            out[i] = f_t[j] - t
    return out


def relative_growth(samples: Sequence[float], warmup: int = 1, window: int = 3) -> float:
    """Growth of a resource (e.g. resident memory) over a run: median of the last ``window``
    samples / median of the first ``window`` samples after ``warmup`` ones, minus 1.

    Medians make one spike harmless; the warm-up skips allocator and cache start-up. Needs at
    least ``warmup + 2`` samples (ValueError otherwise); with fewer than ``2 * window`` left,
    the window shrinks to half of what remains.
    """
    arr = np.asarray(samples, dtype=float)[warmup:]
    if arr.size < 2:
        raise ValueError(f"need at least {warmup + 2} samples, got {arr.size + warmup}")
    w = max(1, min(window, arr.size // 2))
    first = float(np.median(arr[:w]))
    if first <= 0:
        raise ValueError("the first samples must be positive")
    return float(np.median(arr[-w:])) / first - 1.0


def trend(times: Sequence[float], values: Sequence[float], *, rel_threshold: float = 0.10,
          alpha: float = 0.05) -> dict:
    """Does ``values`` trend upward over ``times``?

    Upward means both: Kendall's tau > 0 with a one-sided p-value < ``alpha`` (a monotonic
    association, robust to outliers), and the Theil-Sen slope times the time span exceeds
    ``rel_threshold`` x the median value (a rise large enough to matter). Source: Sen (1968),
    Mann-Kendall trend test; scipy's ``kendalltau`` and ``theilslopes``.

    Returns ``{"slope", "rise", "rel_rise", "tau", "p_value", "upward"}`` with ``slope`` in
    value units per time unit and ``rise = slope * span``. Fewer than 3 points: no trend.
    """
    t = np.asarray(times, dtype=float)
    v = np.asarray(values, dtype=float)
    if t.shape != v.shape:
        raise ValueError("times and values must have the same length")
    if t.size < 3 or np.ptp(t) == 0:
        return {"slope": 0.0, "rise": 0.0, "rel_rise": 0.0, "tau": 0.0, "p_value": 1.0,
                "upward": False}
    slope = float(sps.theilslopes(v, t).slope)
    res = sps.kendalltau(t, v, alternative="greater")
    tau = 0.0 if np.isnan(res.statistic) else float(res.statistic)
    p = 1.0 if np.isnan(res.pvalue) else float(res.pvalue)
    rise = slope * float(np.ptp(t))
    median = float(np.median(v))
    rel = rise / median if median > 0 else (np.inf if rise > 0 else 0.0)
    return {"slope": slope, "rise": rise, "rel_rise": float(rel), "tau": tau, "p_value": p,
            "upward": bool(tau > 0 and p < alpha and rel > rel_threshold)}
