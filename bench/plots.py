"""Matplotlib figures of the benchmark reports (Agg backend: no display needed). Each function
takes plain numbers and returns a Figure; :func:`bench.results.save` writes it as PNG."""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def _label(ax, xlabel: str, ylabel: str, title: str, grid: bool = False) -> None:
    """Name the axes of ``ax`` and title it; ``grid``: a light grid behind."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if grid:
        ax.grid(alpha=0.3)


def latency_histogram(latencies_ms: Sequence[float], title: str, label: str = "latency (ms)"):
    """Histogram with p50/p95/p99 marked."""
    fig, ax = plt.subplots(figsize=(6, 3.5))
    lat = np.asarray(latencies_ms, dtype=float)
    if lat.size:
        ax.hist(lat, bins=min(40, max(5, lat.size // 3)), color="#4878d0")
        for p, style in ((50, "-"), (95, "--"), (99, ":")):
            v = np.percentile(lat, p)
            ax.axvline(v, color="k", linestyle=style, label=f"p{p} {v:.0f} ms")
        ax.legend()
    _label(ax, label, "count", title)
    return fig


def tradeoff(points: list[dict], title: str):
    """Latency-throughput trade-off: one point per setting, ``{"label", "fps",
    "latency_ms"}`` (p50), with the p95 as an error bar top when given (``"latency_p95_ms"``)."""
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for p in points:
        up = (p.get("latency_p95_ms") or p["latency_ms"]) - p["latency_ms"]
        ax.errorbar(p["fps"], p["latency_ms"], yerr=[[0], [max(up, 0)]], fmt="o", capsize=3)
        ax.annotate(p["label"], (p["fps"], p["latency_ms"]), textcoords="offset points",
                    xytext=(4, 4), fontsize=8)
    _label(ax, "frames per second (higher is better)", "action-to-frame ms, p50 (bar: p95)",
           title, grid=True)
    return fig


def ratio_bars(ratios: dict[str, float], title: str):
    """Horizontal bars of ``name -> ratio`` with the 1x line (> 1: the engine's way is faster)."""
    fig, ax = plt.subplots(figsize=(6.5, 0.5 + 0.5 * max(len(ratios), 1)))
    names = list(ratios)
    values = [ratios[n] for n in names]
    ax.barh(names, values, color=["#6acc64" if v >= 1 else "#d65f5f" for v in values])
    ax.axvline(1.0, color="k", linewidth=1)
    for i, v in enumerate(values):
        ax.text(v, i, f" {v:.2f}x", va="center", fontsize=8)
    ax.set_xlabel("speed ratio")
    ax.set_title(title)
    return fig


def timeline(minutes: Sequence[float], series: dict[str, Sequence[float]], title: str):
    """One panel per series over time (soak: RSS, pool occupancy, latency percentiles)."""
    fig, axes = plt.subplots(len(series), 1, figsize=(6.5, 2.2 * len(series)), sharex=True,
                             squeeze=False)
    for ax, (name, values) in zip(axes[:, 0], series.items(), strict=True):
        ax.plot(minutes, values, marker="o")
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
    axes[-1, 0].set_xlabel("minutes")
    axes[0, 0].set_title(title)
    return fig


def scaling(counts: Sequence[int], per_session_fps: Sequence[float],
            aggregate_fps: Sequence[float], latency_p95_ms: Sequence[float], title: str):
    """fps per session and aggregate, and p95 latency, against concurrent sessions."""
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.5))
    a.plot(counts, per_session_fps, marker="o", label="per session (mean)")
    a.plot(counts, aggregate_fps, marker="s", label="aggregate")
    a.set_xlabel("sessions")
    a.set_ylabel("fps")
    a.legend()
    a.grid(alpha=0.3)
    b.plot(counts, latency_p95_ms, marker="o", color="#d65f5f")
    b.set_xlabel("sessions")
    b.set_ylabel("action-to-frame p95 (ms)")
    b.grid(alpha=0.3)
    fig.suptitle(title)
    return fig


def latency_over_time(t_s: Sequence[float], latencies_ms: Sequence[float], title: str):
    fig, ax = plt.subplots(figsize=(6.5, 3))
    ax.plot(t_s, latencies_ms, marker=".", linestyle="none")
    _label(ax, "time since the first action (s)", "latency (ms)", title, grid=True)
    return fig


def stage_bars(stages_ms: dict[str, float], title: str):
    """One stacked bar of the mean time per stage."""
    fig, ax = plt.subplots(figsize=(6.5, 1.8))
    left = 0.0
    for name, value in stages_ms.items():
        ax.barh([0], [value], left=left, label=f"{name} {value:.1f}")
        left += value
    ax.set_yticks([])
    ax.set_xlabel("ms")
    ax.legend(fontsize=7, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.45))
    ax.set_title(title)
    return fig
