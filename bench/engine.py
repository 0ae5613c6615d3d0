"""``python -m bench engine``: the engine's latency-throughput trade-off.

For chunks of 1, 2 and 4 frames and 1-4 denoising steps, one session streams through the real
engine thread for ``--seconds`` while random keys are pressed at random moments
(``bench.streams``). Per setting: fps, time to first frame (median of 3 fresh sessions on the
idle engine, after a warm-up one), per-stage ms (queue, denoise, cache fill, decode; encode
and transport are measured by the ``e2e`` suite, on the server), and the action-to-frame
latency distribution (p50/p95/p99).
Each chunk size attends the same ``--context-frames`` of context (window = ceil(context / f)
chunks). Chunk sizes other than the model's trained one run the same weights (same cost).
"""

from __future__ import annotations

import argparse
import math
import sys

from worldstream.bench import harness
from worldstream.bench.harness import Models, make_generator
from worldstream.bench.streams import bench_engine_config, measure_ttff, run_streams


def sweep(models: Models, *, chunk_sizes: list[int], steps_list: list[int], seconds: float,
          fps: int, context_frames: int) -> list[dict]:
    """One row per (chunk frames, steps): the session summary of ``bench.streams``."""
    from worldstream.engine.core.engine import Engine

    rows = []
    for f in chunk_sizes:
        w = math.ceil(context_frames / f)
        gen = make_generator(models, f, window_chunks=w, memory_chunks=w, max_states=2)
        for steps in steps_list:
            with Engine(gen, bench_engine_config(fps=fps, steps=steps, chunk_frames=f)) as eng:
                measure_ttff(eng, repeats=1, fps=fps)  # warm-up (loads the text encoder)
                ttff = measure_ttff(eng, repeats=3, fps=fps)
                run = run_streams(eng, seconds=seconds, fps=fps, seed=f * 10 + steps)
            s = run.sessions[0].summary()
            s["ttff_ms"] = ttff["p50"]
            rows.append({"chunk_frames": f, "steps": steps, "window_chunks": w, **s})
            print(f"chunk {f} steps {steps}: {s['fps']:.1f} fps, p50 "
                  f"{s['action_to_frame_ms']['p50']} ms", file=sys.stderr)
    return rows


def _markdown(payload: dict) -> str:
    from worldstream.bench.results import context_md, table

    rows = []
    for r in payload["rows"]:
        lat = r["action_to_frame_ms"]
        st = r["stages_ms"]
        rows.append([r["chunk_frames"], r["steps"], r["fps"], r["ttff_ms"], lat["p50"],
                     lat["p95"], lat["p99"], lat["count"], st.get("denoise"),
                     st.get("cache_fill"), st.get("decode"), st.get("queue")])
    return ("# Engine: latency-throughput trade-off\n\n" + context_md(payload) + "\n"
            + table(["chunk frames", "steps", "fps", "TTFF ms", "a2f p50 ms", "a2f p95 ms",
                     "a2f p99 ms", "actions", "denoise ms", "cache fill ms", "decode ms",
                     "queue ms"], rows)
            + "\na2f = action-to-frame: key submitted to the engine -> first frame conditioned "
              "on it ready (engine side; the browser side is in `e2e`). Stage ms are per "
              "chunk (p50).\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench engine", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    harness.add_common_args(parser)
    parser.add_argument("--chunks", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--steps", type=int, nargs="+", default=[1, 2, 3, 4])
    parser.add_argument("--seconds", type=float, default=None, help="per setting (default 8)")
    parser.add_argument("--fps", type=int, default=60,
                        help="target fps (default 60: above CPU throughput, so fps = throughput)")
    parser.add_argument("--context-frames", type=int, default=6)
    args = parser.parse_args(argv)
    harness.apply_common_args(args)

    from worldstream.bench import plots, results
    from worldstream.bench.common import hardware_info

    seconds = args.seconds or (1.0 if args.smoke else 8.0)
    models = harness.load_models(args.weights, smoke=args.smoke)
    rows = sweep(models, chunk_sizes=args.chunks, steps_list=args.steps, seconds=seconds,
                 fps=args.fps, context_frames=args.context_frames)
    payload = results.stamp_payload("engine", {
        "hardware": hardware_info(), "model": models.describe(),
        "settings": {"target_fps": args.fps, "seconds": seconds,
                     "context_frames": args.context_frames, "threads": args.threads,
                     "degradation": "off", "smoke": args.smoke},
        "rows": rows}, argv)
    points = [{"label": f"{r['chunk_frames']}f/{r['steps']}s", "fps": r["fps"],
               "latency_ms": r["action_to_frame_ms"]["p50"] or 0.0,
               "latency_p95_ms": r["action_to_frame_ms"]["p95"]} for r in rows]
    folder = results.save("engine", payload, _markdown(payload), {
        "tradeoff": plots.tradeoff(points, "latency vs throughput (chunk frames / steps)")})
    print(f"report: {folder / 'result.md'}", file=sys.stderr)
    results.print_json(payload, args.json)
    return 0
