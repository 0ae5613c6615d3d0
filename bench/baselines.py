"""``python -m bench baselines``: the engine's design choices against their alternatives, side
by side in one run, each as a ratio (> 1: the engine's way is faster).

* ``kv_cache_vs_recompute`` — KV-cached streaming (window = the whole context) vs the naive
  baseline that re-runs the dense block-causal forward over the whole context at every
  denoising step (no cache); same model, same context length, decode included in both.
* ``sparse_vs_dense`` — long memory attended as sink/window + top-k selected older pages vs
  the same memory attended densely (every page, every chunk).
* ``bf16_vs_fp32`` — the same stream in bf16 vs fp32 weights and KV pool.
* ``batched_vs_one_by_one`` — two sessions generated in one batched call vs one after the
  other (= aggregate fps of two batched sessions / fps of one session).
* ``chunked_vs_frame_by_frame`` — chunks of 2 frames vs 1 frame at the same context length.
* ``channels_last_vs_nchw`` — the autoencoder with channels-last (NHWC) weights, as the
  backend loads it, vs the default NCHW layout (same weights, same stream).
* ``steady_guidance_vs_none`` — every chunk guided on the prompt at its high-noise steps
  (``BuiltinConfig.steady_guidance_sigma``, the landscape's default) vs guided only after a
  switch: what keeping new ground in the prompt's scene costs (a ratio under 1).
* ``batched_vs_sequential_guidance`` — a guided step's negative forward batched with its
  conditional one (``StreamConfig.batched_guidance``) vs run before it.
* ``last_step_cache_vs_fill`` — each chunk's cache entry taken from its last denoising step's
  keys/values (``StreamConfig.last_step_cache_sigma``, the built-in default at 4 steps) vs a
  cache fill forward after every chunk.
* ``first_step_from_memory_vs_full`` — the first denoising step's prediction taken from the
  chunk's memory base (``BuiltinConfig.first_step_from_memory``, the landscape's default) vs
  a forward at σ = 1 (with steady guidance, the guided one).

All are measured below the engine thread (``bench.harness``: steady-state wall time per
``generate`` call after the memory is full), so scheduling cannot blur them.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from worldstream.bench import harness
from worldstream.bench.harness import Models, make_generator, naive_recompute_ms, time_stream


def kv_cache_vs_recompute(models: Models, *, context_frames: int, steps: int,
                          chunk_frames: int = 2, chunks: int = 4, naive_repeats: int = 2) -> dict:
    """Per-chunk ms with the KV cache (window of ``context_frames``) and without."""
    if context_frames % chunk_frames:
        raise ValueError("context_frames must be a multiple of chunk_frames")
    w = context_frames // chunk_frames
    gen = make_generator(models, chunk_frames, window_chunks=w, memory_chunks=w, max_states=1)
    cached = time_stream(gen, steps=steps, chunks=chunks)
    naive = naive_recompute_ms(models, context_frames=context_frames, chunk_frames=chunk_frames,
                               steps=steps, repeats=naive_repeats)
    return {"context_frames": context_frames, "cached_chunk_ms": cached["chunk_ms"],
            "cached_stages_ms": cached["stages_ms"], "naive_chunk_ms": naive["chunk_ms"],
            "naive_model_ms": naive["model_ms"],
            "speedup": naive["chunk_ms"] / cached["chunk_ms"]}


def sparse_vs_dense(models: Models, *, memory_frames: int, steps: int, window_chunks: int = 3,
                    topk_pages: int = 8, chunk_frames: int = 2, chunks: int = 4) -> dict:
    """Per-chunk ms attending ``memory_frames`` densely vs window + top-k older pages."""
    m = memory_frames // chunk_frames
    if m <= window_chunks:
        raise ValueError("memory_frames must exceed the window for sparse memory to matter")
    dense = time_stream(make_generator(models, chunk_frames, window_chunks=m, memory_chunks=m,
                                       max_states=1), steps=steps, chunks=chunks)
    sparse = time_stream(make_generator(models, chunk_frames, window_chunks=window_chunks,
                                        memory_chunks=m, topk_pages=topk_pages, sink=True,
                                        max_states=1), steps=steps, chunks=chunks)
    return {"memory_frames": memory_frames, "window_chunks": window_chunks,
            "topk_pages": topk_pages, "dense_chunk_ms": dense["chunk_ms"],
            "sparse_chunk_ms": sparse["chunk_ms"],
            "speed": dense["chunk_ms"] / sparse["chunk_ms"]}


def bf16_vs_fp32(models: Models, *, steps: int, chunks: int = 4, **config) -> dict:
    """fp32 vs bf16 autocast (matmuls, convolutions and attention in bf16; weights and the KV
    pool stay fp32). NOTE: autocast, because ``BuiltinConfig(dtype=bfloat16)`` fails in
    ``WorldDiT.forward`` (the text embedding enters ``text_proj`` as fp32)."""
    fp32 = time_stream(make_generator(models, max_states=1, **config), steps=steps,
                       chunks=chunks)["chunk_ms"]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        bf16 = time_stream(make_generator(models, max_states=1, **config), steps=steps,
                           chunks=chunks)["chunk_ms"]
    return {"fp32_chunk_ms": fp32, "bf16_chunk_ms": bf16, "mode": "autocast",
            "speed": fp32 / bf16}


def batched_vs_one_by_one(models: Models, *, steps: int, sessions: int = 2, chunks: int = 4,
                          **config) -> dict:
    """Aggregate fps of ``sessions`` streams in one batched forward / fps of one stream. The
    streaming default generates each job on its own (``batch_invariant``, for exact replay):
    this ratio is what that gives up."""
    config.setdefault("batch_invariant", False)
    gen = make_generator(models, max_states=sessions, **config)
    one = time_stream(gen, sessions=1, steps=steps, chunks=chunks)
    batched = time_stream(gen, sessions=sessions, steps=steps, chunks=chunks)
    return {"sessions": sessions, "one_fps": one["fps"], "batched_aggregate_fps": batched["fps"],
            "one_chunk_ms": one["chunk_ms"], "batched_chunk_ms": batched["chunk_ms"],
            "aggregate_ratio": batched["fps"] / one["fps"]}


def chunked_vs_frame_by_frame(models: Models, *, steps: int, context_frames: int = 6,
                              chunk_frames: int = 2, chunks: int = 4) -> dict:
    """fps with chunks of ``chunk_frames`` vs 1 frame, both attending ``context_frames``."""
    fps = {}
    for f in (1, chunk_frames):
        w = context_frames // f
        fps[f] = time_stream(make_generator(models, f, window_chunks=w, memory_chunks=w,
                                            max_states=1), steps=steps, chunks=chunks)["fps"]
    return {"frame_fps": fps[1], "chunked_fps": fps[chunk_frames], "chunk_frames": chunk_frames,
            "speed": fps[chunk_frames] / fps[1]}


def channels_last_vs_nchw(models: Models, *, steps: int, chunks: int = 4, **config) -> dict:
    """Per-chunk ms with the autoencoder in channels-last layout (the backend's) vs NCHW."""
    fast = make_generator(models, max_states=1, **config)
    plain = make_generator(models, max_states=1, **config)
    plain.ae = plain.ae.to(memory_format=torch.contiguous_format)
    nhwc = time_stream(fast, steps=steps, chunks=chunks)
    nchw = time_stream(plain, steps=steps, chunks=chunks)
    return {"channels_last_chunk_ms": nhwc["chunk_ms"], "nchw_chunk_ms": nchw["chunk_ms"],
            "channels_last_stages_ms": nhwc["stages_ms"], "nchw_stages_ms": nchw["stages_ms"],
            "speed": nchw["chunk_ms"] / nhwc["chunk_ms"]}


def _alternating(gens: dict, *, steps: int, chunks: int, rounds: int) -> dict[str, float]:
    """Median per-chunk ms of each generator of ``gens`` (name -> generator), in ``rounds``
    alternating rounds of ``chunks`` chunks each (the order reversed every other round): a
    shared machine's speed drifts by tens of percent within a minute, so only interleaved
    rounds compare them."""
    times: dict[str, list[float]] = {name: [] for name in gens}
    for r in range(rounds):
        for name, gen in list(gens.items())[:: 1 if r % 2 else -1]:
            times[name] += time_stream(gen, steps=steps, chunks=chunks, seed=r)["chunk_ms_all"]
    return {name: statistics.median(t) for name, t in times.items()}


def compiled_vs_eager(models: Models, *, steps: int, chunks: int = 4, rounds: int = 5,
                      **config) -> dict:
    """Per-chunk ms with the world model compiled (``BuiltinConfig.compile``, the playground's
    default) vs run eagerly (:func:`_alternating`). ``compile_s`` is the compiled generator's
    construction (the compiler and its warm-up chunks)."""
    t0 = time.perf_counter()
    fast = make_generator(models, max_states=2, compile=True, **config)
    compile_s = time.perf_counter() - t0
    plain = make_generator(models, max_states=2, **config)
    ms = _alternating({"compiled": fast, "eager": plain}, steps=steps, chunks=chunks,
                      rounds=rounds)
    return {"compiled_chunk_ms": ms["compiled"], "eager_chunk_ms": ms["eager"],
            "compile_s": compile_s, "rounds": rounds, "speed": ms["eager"] / ms["compiled"]}


def steady_guidance_vs_none(models: Models, *, steps: int, chunks: int = 4, rounds: int = 4,
                            sigma: float = 0.6, **config) -> dict:
    """Per-chunk ms with ``steady_guidance_sigma=sigma`` vs None (:func:`_alternating`). Both
    generators guide no chunk after the stream's start (``guidance_chunks=0``), so they
    differ in the steady rule alone."""
    config = {"guidance_chunks": 0, **config}
    steady = make_generator(models, max_states=1, steady_guidance_sigma=sigma, **config)
    plain = make_generator(models, max_states=1, steady_guidance_sigma=None, **config)
    ms = _alternating({"steady": steady, "none": plain}, steps=steps, chunks=chunks,
                      rounds=rounds)
    return {"steady_chunk_ms": ms["steady"], "none_chunk_ms": ms["none"], "sigma": sigma,
            "rounds": rounds, "speed": ms["none"] / ms["steady"]}


def batched_vs_sequential_guidance(models: Models, *, steps: int, chunks: int = 4,
                                   rounds: int = 4, **config) -> dict:
    """Per-chunk ms with each guided step's negative forward batched beside its conditional
    one (``StreamConfig.batched_guidance``, the default) vs run before it
    (:func:`_alternating`); both at the default steady prompt guidance, so each chunk's
    high-noise steps are guided."""
    batched = make_generator(models, max_states=1, batched_guidance=True, **config)
    sequential = make_generator(models, max_states=1, batched_guidance=False, **config)
    ms = _alternating({"batched": batched, "sequential": sequential}, steps=steps,
                      chunks=chunks, rounds=rounds)
    return {"batched_chunk_ms": ms["batched"], "sequential_chunk_ms": ms["sequential"],
            "rounds": rounds, "speed": ms["sequential"] / ms["batched"]}


def last_step_cache_vs_fill(models: Models, *, steps: int, chunks: int = 4, rounds: int = 4,
                            **config) -> dict:
    """Per-chunk ms with ``last_step_cache_sigma=0.3`` (no cache fill where the last step's
    σ is at most 0.3: at 3-4 steps) vs None (a fill forward every chunk;
    :func:`_alternating`; each timed ``generate`` runs the previous chunk's deferred fill)."""
    kept = make_generator(models, max_states=1, last_step_cache_sigma=0.3, **config)
    filled = make_generator(models, max_states=1, last_step_cache_sigma=None, **config)
    ms = _alternating({"kept": kept, "filled": filled}, steps=steps, chunks=chunks,
                      rounds=rounds)
    return {"last_step_chunk_ms": ms["kept"], "fill_chunk_ms": ms["filled"], "rounds": rounds,
            "speed": ms["filled"] / ms["kept"]}


def first_step_from_memory_vs_full(models: Models, *, steps: int, chunks: int = 4,
                                   rounds: int = 4, **config) -> dict:
    """Per-chunk ms with ``first_step_from_memory`` (no forward at σ = 1; the config allows
    it from 2 steps, so ``steps`` 1 compares two full schedules) vs without
    (:func:`_alternating`)."""
    fast = make_generator(models, max_states=1, first_step_from_memory=max(steps, 2), **config)
    full = make_generator(models, max_states=1, first_step_from_memory=None, **config)
    ms = _alternating({"fast": fast, "full": full}, steps=steps, chunks=chunks, rounds=rounds)
    return {"from_memory_chunk_ms": ms["fast"], "full_chunk_ms": ms["full"], "rounds": rounds,
            "speed": ms["full"] / ms["fast"]}


def run(models: Models, *, steps: int, context_frames: int, memory_frames: int,
        chunks: int = 4, naive_repeats: int = 2) -> dict:
    """Every baseline of this module; ``ratios`` gathers the headline ratio of each."""
    out = {
        "kv_cache_vs_recompute": kv_cache_vs_recompute(
            models, context_frames=context_frames, steps=steps, chunks=chunks,
            naive_repeats=naive_repeats),
        "sparse_vs_dense": sparse_vs_dense(models, memory_frames=memory_frames, steps=steps,
                                           chunks=chunks),
        "bf16_vs_fp32": bf16_vs_fp32(models, steps=steps, chunks=chunks),
        "batched_vs_one_by_one": batched_vs_one_by_one(models, steps=steps, chunks=chunks),
        "chunked_vs_frame_by_frame": chunked_vs_frame_by_frame(models, steps=steps,
                                                               chunks=chunks),
        "channels_last_vs_nchw": channels_last_vs_nchw(models, steps=steps, chunks=chunks),
        "compiled_vs_eager": compiled_vs_eager(models, steps=steps, chunks=chunks),
        "steady_guidance_vs_none": steady_guidance_vs_none(models, steps=steps, chunks=chunks),
        "batched_vs_sequential_guidance": batched_vs_sequential_guidance(
            models, steps=steps, chunks=chunks),
        "last_step_cache_vs_fill": last_step_cache_vs_fill(models, steps=steps, chunks=chunks),
        "first_step_from_memory_vs_full": first_step_from_memory_vs_full(
            models, steps=steps, chunks=chunks),
    }
    out["ratios"] = {
        f"KV cache vs recompute ({context_frames} frames)":
            out["kv_cache_vs_recompute"]["speedup"],
        f"sparse top-k vs dense ({memory_frames} frames)": out["sparse_vs_dense"]["speed"],
        "bf16 vs fp32": out["bf16_vs_fp32"]["speed"],
        "2 sessions batched vs one by one": out["batched_vs_one_by_one"]["aggregate_ratio"],
        "chunks of 2 vs frame by frame": out["chunked_vs_frame_by_frame"]["speed"],
        "autoencoder channels-last vs NCHW": out["channels_last_vs_nchw"]["speed"],
        "world model compiled vs eager": out["compiled_vs_eager"]["speed"],
        "steady prompt guidance vs none": out["steady_guidance_vs_none"]["speed"],
        "guidance batched vs sequential": out["batched_vs_sequential_guidance"]["speed"],
        "last step's keys/values as the cache vs a cache fill":
            out["last_step_cache_vs_fill"]["speed"],
        "first step from memory vs a forward at sigma 1":
            out["first_step_from_memory_vs_full"]["speed"],
    }
    return out


def _markdown(payload: dict) -> str:
    from worldstream.bench.results import context_md, table

    r = payload["baselines"]
    kv, sp = r["kv_cache_vs_recompute"], r["sparse_vs_dense"]
    bf, bt, ch = r["bf16_vs_fp32"], r["batched_vs_one_by_one"], r["chunked_vs_frame_by_frame"]
    cl, co, sg = r["channels_last_vs_nchw"], r["compiled_vs_eager"], r["steady_guidance_vs_none"]
    bg, lc = r["batched_vs_sequential_guidance"], r["last_step_cache_vs_fill"]
    fs = r["first_step_from_memory_vs_full"]
    rows = [
        ["KV cache vs naive recompute", f"{kv['context_frames']} frames of context",
         f"{kv['cached_chunk_ms']:.0f} ms/chunk", f"{kv['naive_chunk_ms']:.0f} ms/chunk",
         kv["speedup"]],
        ["top-k sparse vs dense memory", f"{sp['memory_frames']} frames, window "
         f"{sp['window_chunks']} chunks + top-{sp['topk_pages']} pages",
         f"{sp['sparse_chunk_ms']:.0f} ms/chunk", f"{sp['dense_chunk_ms']:.0f} ms/chunk",
         sp["speed"]],
        ["bf16 (autocast) vs fp32", "default window", f"{bf['bf16_chunk_ms']:.0f} ms/chunk",
         f"{bf['fp32_chunk_ms']:.0f} ms/chunk", bf["speed"]],
        ["2 sessions batched vs one by one", "aggregate fps",
         f"{bt['batched_aggregate_fps']:.1f} fps", f"{bt['one_fps']:.1f} fps",
         bt["aggregate_ratio"]],
        ["chunks of 2 vs frame by frame", "fps, same context",
         f"{ch['chunked_fps']:.1f} fps", f"{ch['frame_fps']:.1f} fps", ch["speed"]],
        ["autoencoder channels-last vs NCHW", "default window",
         f"{cl['channels_last_chunk_ms']:.0f} ms/chunk", f"{cl['nchw_chunk_ms']:.0f} ms/chunk",
         cl["speed"]],
        ["world model compiled vs eager", f"default window, compiled in {co['compile_s']:.0f} s",
         f"{co['compiled_chunk_ms']:.0f} ms/chunk", f"{co['eager_chunk_ms']:.0f} ms/chunk",
         co["speed"]],
        ["steady prompt guidance vs none", f"guided at sigma >= {sg['sigma']}",
         f"{sg['steady_chunk_ms']:.0f} ms/chunk", f"{sg['none_chunk_ms']:.0f} ms/chunk",
         sg["speed"]],
        ["guidance's negative forward batched vs sequential", "steady prompt guidance",
         f"{bg['batched_chunk_ms']:.0f} ms/chunk", f"{bg['sequential_chunk_ms']:.0f} ms/chunk",
         bg["speed"]],
        ["last step's keys/values as the cache vs a cache fill",
         f"{payload['settings']['steps']} steps", f"{lc['last_step_chunk_ms']:.0f} ms/chunk",
         f"{lc['fill_chunk_ms']:.0f} ms/chunk", lc["speed"]],
        ["first step from memory vs a forward at sigma 1",
         f"{payload['settings']['steps']} steps", f"{fs['from_memory_chunk_ms']:.0f} ms/chunk",
         f"{fs['full_chunk_ms']:.0f} ms/chunk", fs["speed"]],
    ]
    return ("# Baselines: the engine vs the alternatives\n\n" + context_md(payload) + "\n"
            + table(["comparison", "case", "engine", "alternative", "ratio (x)"], rows, 2))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench baselines", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    harness.add_common_args(parser)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--context-frames", type=int, default=64)
    parser.add_argument("--memory-frames", type=int, default=64)
    parser.add_argument("--chunks", type=int, default=4, help="timed chunks per measurement")
    args = parser.parse_args(argv)
    harness.apply_common_args(args)

    from worldstream.bench import plots, results
    from worldstream.bench.common import hardware_info

    models = harness.load_models(args.weights, smoke=args.smoke)
    base = run(models, steps=args.steps, context_frames=args.context_frames,
               memory_frames=args.memory_frames, chunks=args.chunks)
    payload = results.stamp_payload("baselines", {
        "hardware": hardware_info(), "model": models.describe(),
        "settings": {"steps": args.steps, "context_frames": args.context_frames,
                     "memory_frames": args.memory_frames, "threads": args.threads},
        "baselines": base}, argv)
    folder = results.save("baselines", payload, _markdown(payload),
                          {"ratios": plots.ratio_bars(base["ratios"], "engine vs alternatives")})
    results.print_json(payload, args.json)
    print(f"report: {folder / 'result.md'}", file=sys.stderr)
    return 0
