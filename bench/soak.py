"""``python -m bench soak [--minutes 10]``: a long stream, checked for leaks and drift.

One session (``--sessions``) streams through the real engine at ``--fps`` (paced, degradation
off) with random keys. Every ``--sample-s`` (default 60 s: per minute) it records the process's
resident memory (``/proc/self/statm``), the KV page-pool occupancy, and the action-to-frame
latency percentiles and fps of that interval. The run fails (exit 1) when resident memory grows
by more than ``--max-growth`` (default 5%, median of the last 3 samples vs the first 3 after the
first, see :func:`bench.stats.relative_growth`) or the per-interval p50 latency trends upward
(:func:`bench.stats.trend`: Kendall tau significant and a Theil-Sen rise > 10% of the median).

``python -m bench soak --adversarial``: a normal session's fps and latency beside the
adversarial clients instead (:mod:`bench.adversarial`).
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

from worldstream.bench import harness
from worldstream.bench.stats import relative_growth, summarize, trend


def rss_bytes() -> int:
    """Resident set size of this process now (Linux ``/proc/self/statm``)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def verdict(samples: list[dict], *, max_growth: float = 0.05,
            rel_threshold: float = 0.10) -> dict:
    """Pass/fail of a soak from its samples (``{"t_s", "rss_mib", "latency_ms": {"p50"}}``).

    Returns ``{"passed", "rss_growth", "latency_trend", "reasons"}``. Needs >= 3 samples
    (ValueError): the first is a warm-up.
    """
    if len(samples) < 3:
        raise ValueError(f"need at least 3 samples, got {len(samples)}")
    growth = relative_growth([s["rss_mib"] for s in samples], warmup=1)
    timed = [(s["t_s"] / 60, s["latency_ms"]["p50"]) for s in samples[1:]
             if s["latency_ms"]["p50"] is not None]
    lat_trend = trend([t for t, _ in timed], [v for _, v in timed], rel_threshold=rel_threshold)
    reasons = []
    if growth > max_growth:
        reasons.append(f"resident memory grew {growth:.1%} (limit {max_growth:.0%})")
    if lat_trend["upward"]:
        reasons.append(f"latency p50 trends upward: +{lat_trend['rise']:.1f} ms over the run "
                       f"(tau {lat_trend['tau']:.2f}, p {lat_trend['p_value']:.3f})")
    return {"passed": not reasons, "rss_growth": growth, "latency_trend": lat_trend,
            "reasons": reasons}


def soak(gen, *, minutes: float, sample_s: float, fps: int, steps: int, sessions: int = 1,
         seed: int = 0) -> list[dict]:
    """Stream for ``minutes`` on ``gen`` and return one sample per ``sample_s``."""
    from worldstream.bench.streams import bench_engine_config, run_streams
    from worldstream.engine.core.engine import Engine

    samples: list[dict] = []
    last = {"t": 0.0}

    def on_tick(elapsed_s, runs):
        since = last["t"]
        start_ns = runs[0].created_ns  # sessions are created just before the stream starts
        lo = start_ns + int(since * 1e9)
        lat = np.concatenate([r.latencies_ms(since_ns=lo) for r in runs])
        pool = gen.allocator
        samples.append({
            "t_s": elapsed_s, "rss_mib": rss_bytes() / 2**20,
            "pool_pages_used": pool.num_pages - pool.num_free(),
            "pool_pages": pool.num_pages,
            "fps": float(np.mean([r.fps(since_ns=lo) for r in runs])),
            "frames": sum(len(r.frame_ns) for r in runs),
            "latency_ms": summarize(lat)})
        last["t"] = elapsed_s
        print(f"[soak] {elapsed_s / 60:.1f} min: rss {samples[-1]['rss_mib']:.0f} MiB, "
              f"pool {samples[-1]['pool_pages_used']}/{pool.num_pages}, fps "
              f"{samples[-1]['fps']:.1f}, p50 {samples[-1]['latency_ms']['p50']}", file=sys.stderr)

    with Engine(gen, bench_engine_config(fps=fps, steps=steps)) as engine:
        run_streams(engine, sessions=sessions, seconds=minutes * 60, fps=fps, seed=seed,
                    on_tick=on_tick, tick_s=sample_s)
    return samples


def _markdown(payload: dict) -> str:
    from worldstream.bench.results import context_md, table

    v = payload["verdict"]
    rows = [[s["t_s"] / 60, s["rss_mib"], s["pool_pages_used"], s["fps"],
             s["latency_ms"]["p50"], s["latency_ms"]["p95"], s["latency_ms"]["p99"],
             s["latency_ms"]["count"]] for s in payload["samples"]]
    status = "PASSED" if v["passed"] else "FAILED: " + "; ".join(v["reasons"])
    return ("# Soak\n\n" + context_md(payload) + f"\n**{status}** — resident memory growth "
            f"{v['rss_growth']:.2%}, latency p50 trend {v['latency_trend']['rise']:+.1f} ms "
            f"over the run.\n\n"
            + table(["minute", "RSS MiB", "pool pages used", "fps", "a2f p50 ms", "a2f p95 ms",
                     "a2f p99 ms", "actions"], rows))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--adversarial" in argv:  # the server under adversarial clients: bench.adversarial
        from worldstream.bench import adversarial

        return adversarial.main([a for a in argv if a != "--adversarial"])
    parser = argparse.ArgumentParser(prog="python -m bench soak", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    harness.add_common_args(parser)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--sample-s", type=float, default=None,
                        help="sampling interval (default 60 s, or minutes*60/10 if shorter)")
    parser.add_argument("--fps", type=int, default=15)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--sessions", type=int, default=1)
    parser.add_argument("--max-growth", type=float, default=0.05)
    args = parser.parse_args(argv)
    harness.apply_common_args(args)
    if args.minutes <= 0:
        raise SystemExit("--minutes must be > 0")

    from worldstream.bench import plots, results
    from worldstream.bench.common import hardware_info

    sample_s = args.sample_s or min(60.0, args.minutes * 6)
    models = harness.load_models(args.weights, smoke=args.smoke)
    gen = harness.make_generator(models, max_states=max(2, args.sessions))
    samples = soak(gen, minutes=args.minutes, sample_s=sample_s, fps=args.fps, steps=args.steps,
                   sessions=args.sessions)
    v = verdict(samples, max_growth=args.max_growth)
    payload = results.stamp_payload("soak", {
        "hardware": hardware_info(), "model": models.describe(),
        "settings": {"minutes": args.minutes, "sample_s": sample_s, "fps": args.fps,
                     "steps": args.steps, "sessions": args.sessions, "threads": args.threads,
                     "max_growth": args.max_growth, "smoke": args.smoke},
        "passed": v["passed"], "verdict": v, "samples": samples}, argv)
    minutes = [s["t_s"] / 60 for s in samples]
    folder = results.save("soak", payload, _markdown(payload), {
        "timeline": plots.timeline(minutes, {
            "RSS (MiB)": [s["rss_mib"] for s in samples],
            "pool pages used": [s["pool_pages_used"] for s in samples],
            "a2f p50 (ms)": [s["latency_ms"]["p50"] or np.nan for s in samples],
            "a2f p95 (ms)": [s["latency_ms"]["p95"] or np.nan for s in samples]},
            "soak: memory and latency over time")})
    print(f"report: {folder / 'result.md'}", file=sys.stderr)
    results.print_json(payload, args.json)
    return 0 if v["passed"] else 1
