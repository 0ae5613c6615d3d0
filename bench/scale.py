"""``python -m bench scale``: 1/2/4/8 concurrent sessions on one engine.

For each count, a fresh engine (``--max-sessions``, default the product's
``EngineConfig.max_sessions``) admits sessions until it refuses (``CapacityError``), then all
admitted sessions stream at ``--fps`` (paced, degradation off) with random keys for
``--seconds``. Reported per count: admitted sessions, per-session fps (mean, min), aggregate
fps, pooled action-to-frame p50/p95/p99, and the session number from which admission refused.

``python -m bench scale --replicas 1,2``: engine replicas on Ray instead (:mod:`bench.replicas`);
``python -m bench scale --hosts 2 --replicas 1,2,4 --model emulated``: across hosts made of
network namespaces (:mod:`bench.cluster.scale_out`).
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from worldstream.bench import harness
from worldstream.bench.stats import summarize


def probe_admission(engine, limit: int = 64) -> int:
    """How many sessions ``engine`` admits before its first CapacityError (closes them all);
    ``limit`` if it never refuses."""
    from worldstream.engine.core.api import CapacityError

    ids = []
    try:
        for _ in range(limit):
            try:
                ids.append(engine.create_session("probe", seed=0).session_id)
            except CapacityError:
                break
    finally:
        for sid in ids:
            engine.close_session(sid)
    return len(ids)


def scale(gen, *, counts: list[int], seconds: float, fps: int, steps: int,
          max_sessions: int) -> dict:
    from worldstream.bench.streams import bench_engine_config, measure_ttff, run_streams
    from worldstream.engine.core.engine import Engine

    rows = []
    config = bench_engine_config(fps=fps, steps=steps, max_sessions=max_sessions)
    with Engine(gen, config) as engine:
        admitted = probe_admission(engine)
        measure_ttff(engine, repeats=1, fps=fps)  # warm-up (loads the text encoder)
        for n in counts:
            run = run_streams(engine, sessions=n, seconds=seconds, fps=fps, seed=n)
            fpss = [r.steady_fps() for r in run.sessions]
            lat = np.concatenate([r.latencies_ms() for r in run.sessions])
            rows.append({"sessions": n, "admitted": len(run.sessions),
                         "refused_at": run.refused_at,
                         "per_session_fps_mean": float(np.mean(fpss)),
                         "per_session_fps_min": float(np.min(fpss)),
                         "aggregate_fps": float(np.sum(fpss)),
                         "mean_batch_size": run.mean_batch_size,
                         "action_to_frame_ms": summarize(lat),
                         "ttff_ms": [r.summary()["ttff_ms"] for r in run.sessions]})
            print(f"[scale] {n} sessions: admitted {len(run.sessions)}, aggregate "
                  f"{rows[-1]['aggregate_fps']:.1f} fps", file=sys.stderr)
    return {"admission_limit": admitted, "refuses_from_session": admitted + 1, "rows": rows}


def _markdown(payload: dict) -> str:
    from worldstream.bench.results import context_md, table

    res = payload["scale"]
    rows = [[r["sessions"], r["admitted"], r["per_session_fps_mean"], r["per_session_fps_min"],
             r["aggregate_fps"], r["action_to_frame_ms"]["p50"], r["action_to_frame_ms"]["p95"],
             r["action_to_frame_ms"]["p99"]] for r in res["rows"]]
    return ("# Scale: concurrent sessions\n\n" + context_md(payload)
            + f"\nAdmission admits {res['admission_limit']} sessions and refuses from session "
              f"{res['refuses_from_session']} on (HTTP 503 with retry_after_s at the server).\n\n"
            + table(["sessions asked", "admitted", "fps/session (mean)", "fps/session (min)",
                     "aggregate fps", "a2f p50 ms", "a2f p95 ms", "a2f p99 ms"], rows))


def _hosts_options() -> str:
    """The options of ``--hosts`` runs (:mod:`bench.cluster.scale_out`), read from its parser."""
    from worldstream.bench.cluster import scale_out

    lines = [f"  {' '.join(a.option_strings)}: {a.help or ''}"
             for a in scale_out._parser()._actions if a.option_strings and a.dest != "help"]
    return "across hosts (--hosts N; `python -m bench scale --hosts 2 --help`):\n" + "\n".join(
        lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if any(a == "--hosts" or a.startswith("--hosts=") for a in argv):
        from worldstream.bench.cluster import scale_out  # hosts as network namespaces

        return scale_out.main(argv)
    if any(a == "--replicas" or a.startswith("--replicas=") for a in argv):
        from worldstream.bench import replicas  # engine replicas on Ray: a suite of its own

        return replicas.main(argv)
    from worldstream.engine.core.config import EngineConfig

    parser = argparse.ArgumentParser(prog="python -m bench scale", description=__doc__,
                                     epilog=_hosts_options(),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    harness.add_common_args(parser)
    parser.add_argument("--counts", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--seconds", type=float, default=None, help="per count (default 10)")
    parser.add_argument("--fps", type=int, default=15)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--max-sessions", type=int, default=EngineConfig.max_sessions)
    args = parser.parse_args(argv)
    harness.apply_common_args(args)

    from worldstream.bench import plots, results
    from worldstream.bench.common import hardware_info

    seconds = args.seconds or (1.0 if args.smoke else 10.0)
    models = harness.load_models(args.weights, smoke=args.smoke)
    gen = harness.make_generator(models, max_states=16)
    res = scale(gen, counts=args.counts, seconds=seconds, fps=args.fps, steps=args.steps,
                max_sessions=args.max_sessions)
    payload = results.stamp_payload("scale", {
        "hardware": hardware_info(), "model": models.describe(),
        "settings": {"fps": args.fps, "steps": args.steps, "seconds": seconds,
                     "max_sessions": args.max_sessions, "model_max_states": gen.max_states,
                     "threads": args.threads, "smoke": args.smoke},
        "scale": res}, argv)
    r = res["rows"]
    folder = results.save("scale", payload, _markdown(payload), {
        "scaling": plots.scaling([x["admitted"] for x in r], [x["per_session_fps_mean"] for x in r],
                                 [x["aggregate_fps"] for x in r],
                                 [x["action_to_frame_ms"]["p95"] or np.nan for x in r],
                                 "sessions on one engine")})
    print(f"report: {folder / 'result.md'}", file=sys.stderr)
    results.print_json(payload, args.json)
    return 0
