"""``python -m bench quick --json out.json``: the headline numbers in one short run (<= 3 min on
the 2-core dev CPU), printed as one JSON object.

* ``fps``, ``ttff_ms``, ``action_to_frame_ms_p50/p95/p99``, ``stages_ms`` — one session of the
  real engine thread (product streaming defaults: the responsive mode's chunk, the built-in
  model's recency window; their values are printed at the end of ``--help``),
  random keys pressed at random moments, target ``--fps`` (default 60: above what a CPU
  reaches, so ``fps`` is the sustained throughput; degradation off so steps stay as set).
  Time to first frame: median of 3 fresh sessions on the idle engine after a warm-up one.
* ``batched_2_sessions_aggregate_ratio`` — the same with two concurrent sessions (the engine
  batches them): aggregate fps / the one session's fps (the one-session stream is run half
  before and half after the two, so a drift in the machine's load cancels). ``details`` also
  has the ratio below the engine thread (two states per ``generate`` call vs one).
* ``speedup_vs_recompute`` — KV-cached streaming vs recomputing the whole context
  (``--context-frames``, default 64) at every step without a cache (``bench.baselines``).
* ``sparse_vs_dense_speed`` — top-k sparse memory vs dense attention over the same
  ``--memory-frames`` (default 64) of memory.

``--env ID [--model-path DIR]``: the same figures for a game's learned world where they apply
(:mod:`bench.quick_game`).
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from worldstream.bench import baselines, harness
from worldstream.bench.harness import Models, make_generator
from worldstream.bench.stats import summarize
from worldstream.bench.streams import bench_engine_config, measure_ttff, run_streams


def run_quick(models: Models, *, seconds: float, fps: int, steps: int, context_frames: int,
              memory_frames: int, chunks: int = 3, naive_repeats: int = 1,
              world: str = "landscape", compile: bool = True) -> dict:
    """Every measurement of the quick suite (see the module docstring); returns the flat
    headline keys plus ``details``. ``world="avatar"``: the sessions stream through the
    avatar's backend (its start frames, its actions). ``compile``: the engine's model compiled,
    as the playground runs it (``BuiltinConfig.compile``; the baselines stay eager)."""
    from worldstream.engine.core.engine import Engine

    gen = make_generator(models, max_states=4, compile=compile)
    if world == "avatar":
        from worldstream.engine.backends.avatar.backend import AvatarModelBackend

        gen = AvatarModelBackend(gen)
    batched_generate = baselines.batched_vs_one_by_one(models, steps=steps, chunks=chunks)
    config = bench_engine_config(fps=fps, steps=steps)
    with Engine(gen, config) as engine:
        measure_ttff(engine, repeats=1, fps=fps)  # warm-up (loads the text encoder)
        ttff = measure_ttff(engine, fps=fps)
        # one session before and after the two: drift of a shared CPU's load cancels out
        one_a = run_streams(engine, sessions=1, seconds=seconds / 2, fps=fps, seed=1)
        two = run_streams(engine, sessions=2, seconds=seconds, fps=fps, seed=2)
        one_b = run_streams(engine, sessions=1, seconds=seconds / 2, fps=fps, seed=3)
    if not (one_a.sessions and two.sessions and one_b.sessions):
        raise RuntimeError("the engine refused a benchmark session")
    halves = [one_a.sessions[0], one_b.sessions[0]]
    summaries = [h.summary() for h in halves]
    lat = summarize(np.concatenate([h.latencies_ms() for h in halves]))
    s = {"fps": float(np.mean([x["fps"] for x in summaries])), "action_to_frame_ms": lat,
         # a stage missing from a short half (no cache fill yet) is averaged over the other
         "stages_ms": {k: float(np.mean([x["stages_ms"][k] for x in summaries
                                         if k in x["stages_ms"]]))
                       for k in dict.fromkeys(k for x in summaries for k in x["stages_ms"])},
         "halves": summaries}
    kv = baselines.kv_cache_vs_recompute(models, context_frames=context_frames, steps=steps,
                                         chunks=chunks, naive_repeats=naive_repeats)
    sparse = baselines.sparse_vs_dense(models, memory_frames=memory_frames, steps=steps,
                                       chunks=chunks)
    return {
        "fps": s["fps"], "ttff_ms": ttff["p50"],
        "action_to_frame_ms_p50": lat["p50"], "action_to_frame_ms_p95": lat["p95"],
        "action_to_frame_ms_p99": lat["p99"], "actions_measured": lat["count"],
        "stages_ms": s["stages_ms"],
        "speedup_vs_recompute": kv["speedup"],
        "sparse_vs_dense_speed": sparse["speed"],
        "batched_2_sessions_aggregate_ratio": two.aggregate_fps() / s["fps"] if s["fps"] else None,
        # the same ratio below the engine thread (medians of generate calls): less exposed to
        # a shared machine's load changing during the run
        "batched_2_sessions_generate_ratio": batched_generate["aggregate_ratio"],
        "details": {"one_session": s, "two_sessions": [r.summary() for r in two.sessions],
                    "two_sessions_aggregate_fps": two.aggregate_fps(),
                    "engine_mean_batch_size_two_sessions": two.mean_batch_size,
                    "ttff_ms": ttff,
                    "batched_vs_one_by_one_generate": batched_generate,
                    "kv_cache_vs_recompute": kv, "sparse_vs_dense": sparse},
    }


def _markdown(payload: dict) -> str:
    from worldstream.bench.results import context_md, table

    rows = [[k, payload[k]] for k in (
        "fps", "ttff_ms", "action_to_frame_ms_p50", "action_to_frame_ms_p95",
        "action_to_frame_ms_p99", "speedup_vs_recompute", "sparse_vs_dense_speed",
        "batched_2_sessions_aggregate_ratio", "batched_2_sessions_generate_ratio")]
    rows += [[f"stage {k} (ms, p50)", v] for k, v in payload["stages_ms"].items()]
    return ("# Quick benchmark\n\n" + context_md(payload) + "\n"
            + table(["figure", "value"], rows, 2))


def _defaults_line() -> str:
    """The streaming defaults the runs use, read from the configs (not written in prose)."""
    from worldstream.engine.backends.stream_config import StreamConfig
    from worldstream.engine.core.config import MODES

    frames = MODES["responsive"].chunk_frames
    return (f"streaming defaults now: chunks of {frames} frame{'s' if frames != 1 else ''} "
            f"(the responsive mode), a window of {StreamConfig.window_chunks} chunks")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench quick", description=__doc__,
                                     epilog=_defaults_line(),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    harness.add_common_args(parser)
    parser.add_argument("--seconds", type=float, default=None,
                        help="length of each engine stream (default 15; 1.5 with --smoke)")
    parser.add_argument("--fps", type=int, default=60, help="target fps of the streams")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--world", choices=("landscape", "avatar"), default="landscape",
                        help="whose model to time (avatar: sessions stream through its "
                             "backend)")
    parser.add_argument("--env", default=None, metavar="ID",
                        help="time a game's learned world instead (bench.quick_game): its "
                             "Gymnasium id; the model from --model-path, or the shipped one "
                             "of ALE/Pong-v5 and ALE/Breakout-v5")
    parser.add_argument("--model-path", default=None, metavar="DIR",
                        help="with --env: the world's folder (`worldstream train --out DIR`)")
    parser.add_argument("--context-frames", type=int, default=None, help="default 64 (8 smoke)")
    parser.add_argument("--memory-frames", type=int, default=None, help="default 64 (16 smoke)")
    parser.add_argument("--no-save", action="store_true", help="do not write results/quick/")
    parser.add_argument("--no-compile", action="store_true",
                        help="stream the model eagerly (default: compiled, as `worldstream "
                             "play` runs it; --smoke never compiles)")
    args = parser.parse_args(argv)
    harness.apply_common_args(args)
    if args.env is not None:
        from worldstream.bench import quick_game

        return quick_game.main(args, argv)
    if args.model_path is not None:
        parser.error("--model-path goes with --env (the landscape's weights: --weights)")

    from worldstream.bench import plots, results
    from worldstream.bench.common import hardware_info

    smoke = args.smoke
    seconds = args.seconds or (1.5 if smoke else 15.0)
    context = args.context_frames or (8 if smoke else 64)
    memory = args.memory_frames or (16 if smoke else 64)
    compiled = not (args.no_compile or smoke)
    models = harness.load_models(args.weights, smoke=smoke, world=args.world)
    figures = run_quick(models, seconds=seconds, fps=args.fps, steps=args.steps,
                        context_frames=context, memory_frames=memory,
                        chunks=2 if smoke else 3, world=args.world,
                        compile=compiled)
    model = models.describe()
    payload = results.stamp_payload("quick", {
        **{k: v for k, v in figures.items() if k != "details"},
        "weights": models.weights, "resolution": model["resolution"],
        "hardware": hardware_info(), "model": model,
        "settings": {"chunk_frames": model["trained_chunk_frames"], "steps": args.steps,
                     "window_chunks": 3, "target_fps": args.fps, "seconds": seconds,
                     "context_frames": context, "memory_frames": memory,
                     "threads": args.threads, "smoke": smoke, "world": args.world,
                     "compiled": compiled},
        "details": figures["details"]}, argv)
    if not args.no_save:
        lat = payload["details"]["one_session"]["action_to_frame_ms"]
        folder = results.save("quick", payload, _markdown(payload), {
            "ratios": plots.ratio_bars({
                "KV cache vs recompute": payload["speedup_vs_recompute"],
                "sparse vs dense memory": payload["sparse_vs_dense_speed"],
                "2 sessions batched (aggregate)": payload["batched_2_sessions_aggregate_ratio"]
                or 0.0}, "quick: ratios"),
            "stages": plots.stage_bars(payload["stages_ms"], f"one chunk ({lat['count']} "
                                       "actions measured)")})
        print(f"report: {folder / 'result.md'}", file=sys.stderr)
    results.print_json(payload, args.json)
    return 0
