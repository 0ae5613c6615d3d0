"""``python -m bench quick --env ID [--model-path DIR] --threads 1``: the quick suite's headline
numbers for a game's learned world (``game-builtin:ID``), in the JSON shape of the landscape's
quick run where a figure applies (the KV-cache and sparse-memory baselines do not: a game world
has neither). Saved under ``results/quick_game/`` (the landscape's ``results/quick/`` stays).

* ``fps``, ``ttff_ms``, ``action_to_frame_ms_p50/p95/p99``, ``stages_ms`` — one session of the
  real engine thread at the playground's chunk size (1 frame), random held keys of the game
  (none or one of its keys, 3 changes a second), target ``--fps`` (default 60: above what a
  CPU reaches, so ``fps`` is the sustained throughput). Time to first frame: median of 3 fresh
  sessions (their start frames come from the real game) after a warm-up one.
* ``batched_2_sessions_aggregate_ratio`` — two concurrent sessions' aggregate fps over one's
  (one session run half before and half after the two). ``..._generate_ratio``: the same below
  the engine thread (median ``generate`` wall time of one state vs two in one call), as the
  backend is configured (``batch_invariant``: each job on its own) and, in ``details``, with
  one ``next_frame`` call for both.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import numpy as np

from worldstream.bench.stats import summarize
from worldstream.bench.streams import bench_engine_config, game_key_sets, measure_ttff, run_streams


def load_game_world(env: str, model_path: str | None, threads: int | None) -> Any:
    """The learned world of ``env`` (``--model-path`` or its shipped folder) on ``threads``
    torch threads (default 1, as ``play`` runs it)."""
    from worldstream.engine.core.registry import env_backend_id, load_backend

    return load_backend(env_backend_id(env, "builtin"), model_path=model_path,
                        cpu_threads=threads or 1)


def generate_ratio(backend: Any, *, calls: int = 15, batch_invariant: bool | None = None) -> dict:
    """Median wall ms of ``generate`` for one state and for two states in one call, after 3
    warm-up calls each; ``aggregate_ratio`` = frames per second with two / with one."""
    from worldstream.engine.core.backend import ChunkJob

    kept = backend.batch_invariant
    if batch_invariant is not None:
        backend.batch_invariant = batch_invariant
    rng = np.random.default_rng(0)
    out = {}
    try:
        for n in (1, 2):
            states = [backend.new_state("bench", i) for i in range(n)]
            times = []
            for i in range(calls + 3):
                jobs = [ChunkJob(s, [int(rng.integers(backend.num_actions))], 1) for s in states]
                t0 = time.perf_counter()
                results = backend.generate(jobs)
                if i >= 3:
                    times.append((time.perf_counter() - t0) * 1e3)
                for r in results:
                    if r.error is not None:
                        raise r.error
            for s in states:
                backend.free(s)
            out[f"ms_{n}"] = statistics.median(times)
    finally:
        backend.batch_invariant = kept
    out["aggregate_ratio"] = 2 * out["ms_1"] / out["ms_2"]
    return out


def run_game_quick(backend: Any, *, seconds: float, fps: int) -> dict:
    """Every measurement (see the module docstring): the flat headline keys plus
    ``details``."""
    from worldstream.engine.core.engine import Engine

    keys = game_key_sets(backend.wire_keys)
    config = bench_engine_config(fps=fps, steps=1)
    with Engine(backend, config) as engine:
        measure_ttff(engine, repeats=1, fps=fps)  # warm-up
        ttff = measure_ttff(engine, fps=fps)
        # one session before and after the two: drift of a shared CPU's load cancels out
        one_a = run_streams(engine, sessions=1, seconds=seconds / 2, fps=fps, seed=1,
                            key_sets=keys)
        two = run_streams(engine, sessions=2, seconds=seconds, fps=fps, seed=2, key_sets=keys)
        one_b = run_streams(engine, sessions=1, seconds=seconds / 2, fps=fps, seed=3,
                            key_sets=keys)
    if not (one_a.sessions and two.sessions and one_b.sessions):
        raise RuntimeError("the engine refused a benchmark session")
    halves = [one_a.sessions[0].summary(), one_b.sessions[0].summary()]
    lat = summarize(np.concatenate([r.sessions[0].latencies_ms() for r in (one_a, one_b)]))
    fps_one = float(np.mean([h["fps"] for h in halves]))
    stages = {k: float(np.mean([h["stages_ms"][k] for h in halves if k in h["stages_ms"]]))
              for k in dict.fromkeys(k for h in halves for k in h["stages_ms"])}
    below = generate_ratio(backend)
    batched = generate_ratio(backend, batch_invariant=False)
    return {
        "fps": fps_one, "ttff_ms": ttff["p50"],
        "action_to_frame_ms_p50": lat["p50"], "action_to_frame_ms_p95": lat["p95"],
        "action_to_frame_ms_p99": lat["p99"], "actions_measured": lat["count"],
        "stages_ms": stages,
        "batched_2_sessions_aggregate_ratio": two.aggregate_fps() / fps_one if fps_one else None,
        "batched_2_sessions_generate_ratio": below["aggregate_ratio"],
        "details": {"one_session": {"fps": fps_one, "action_to_frame_ms": lat,
                                    "stages_ms": stages, "halves": halves},
                    "two_sessions": [r.summary() for r in two.sessions],
                    "two_sessions_aggregate_fps": two.aggregate_fps(),
                    "engine_mean_batch_size_two_sessions": two.mean_batch_size,
                    "ttff_ms": ttff, "generate_one_vs_two": below,
                    "generate_one_vs_two_one_call": batched},
    }


def describe(backend: Any) -> dict:
    """Model facts for the report."""
    unet = backend.model.unet
    return {"name": f"game world GameUNet ({backend.env_id})", "weights": str(backend.folder),
            "params_m": round(sum(p.numel() for p in unet.parameters()) / 1e6, 3),
            "channels": list(unet.config.channels), "context": backend.context,
            "colours": len(backend.model.palette), "bf16": backend.bf16,
            "batch_invariant": backend.batch_invariant,
            "resolution": f"{backend.size}x{backend.size}"}


def markdown(payload: dict) -> str:
    from worldstream.bench.results import context_md, table

    rows = [[k, payload[k]] for k in (
        "fps", "ttff_ms", "action_to_frame_ms_p50", "action_to_frame_ms_p95",
        "action_to_frame_ms_p99", "batched_2_sessions_aggregate_ratio",
        "batched_2_sessions_generate_ratio")]
    rows += [[f"stage {k} (ms, p50)", v] for k, v in payload["stages_ms"].items()]
    return ("# Quick benchmark: a game's learned world\n\n" + context_md(payload) + "\n"
            + table(["figure", "value"], rows, 2))


def main(args: Any, argv: list[str] | None) -> int:
    """``bench quick --env``: run, save under ``results/quick_game/`` (unless ``--no-save``),
    print the JSON."""
    import sys

    from worldstream.bench import plots, results
    from worldstream.bench.common import hardware_info

    seconds = args.seconds or (1.5 if args.smoke else 15.0)
    backend = load_game_world(args.env, args.model_path, args.threads)
    try:
        figures = run_game_quick(backend, seconds=seconds, fps=args.fps)
    finally:
        backend.close()
    payload = results.stamp_payload("quick", {
        **{k: v for k, v in figures.items() if k != "details"},
        "weights": "trained", "resolution": f"{backend.size}x{backend.size}",
        "hardware": hardware_info(), "model": describe(backend),
        "settings": {"chunk_frames": 1, "target_fps": args.fps, "seconds": seconds,
                     "threads": args.threads, "smoke": args.smoke, "world": args.env,
                     "env": args.env, "model_path": str(backend.folder)},
        "details": figures["details"]}, argv)
    if not args.no_save:
        lat = payload["details"]["one_session"]["action_to_frame_ms"]
        folder = results.save("quick_game", payload, markdown(payload), {
            "stages": plots.stage_bars(payload["stages_ms"], f"one chunk ({lat['count']} "
                                       "actions measured)")})
        print(f"report: {folder / 'result.md'}", file=sys.stderr)
    results.print_json(payload, args.json)
    return 0
