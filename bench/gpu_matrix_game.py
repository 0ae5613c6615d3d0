"""Matrix-Game 2.0 streaming speed on a lent GPU: fps, time to first frame, action-to-frame and
memory at 352x640, with and without ``torch.compile`` (one prepared script, <= 8 min).

    python -m bench gpu_matrix_game                  # on a CUDA machine: JSON to $OUT (or .)
    python -m bench gpu_matrix_game --tiny           # anywhere: tiny random shapes on a CPU

The full-size model (random weights: speed does not depend on their values; built as
``bench.matrix_game_cpu`` builds it) runs through the engine's backend as a session does:
chunks of 3 latent frames (12 frames) at the variant's distilled steps, the cache fill after
each chunk, the streaming VAE decode. Per variant and per mode (eager, then compiled: the
blocks' feed-forward, cross-attention and action MLPs):

- ``time_to_first_frame_s``: a fresh stream's start picture (CLIP + VAE encode) and first chunk;
- ``fps``: frames over the wall time of the following chunks (generate + cache fill);
- ``action_to_frame_ms`` p50 / p95: through the engine (command receipt -> first frame ready
  that was conditioned on it) with mouse-look actions every 300 ms for ``--engine-s``;
- ``peak_memory_gib``. The goal of issue 56: >= 25 fps on one H100/H200.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

from worldstream.bench.common import hardware_info
from worldstream.bench.matrix_game_cpu import build_backend
from worldstream.engine.core.api import ActionCommand
from worldstream.engine.core.backend import ChunkJob
from worldstream.engine.core.config import EngineConfig
from worldstream.engine.core.engine import Engine


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tiny", action="store_true", help="tiny random shapes on CPU (smoke run)")
    p.add_argument("--variants", default="universal",
                   help="comma-separated: universal,gta_drive,templerun")
    p.add_argument("--chunks", type=int, default=12, help="chunks of the measured stream")
    p.add_argument("--compile", choices=["both", "off", "on"], default="both")
    p.add_argument("--engine-s", type=float, default=6.0,
                   help="seconds of engine streaming for action-to-frame")
    p.add_argument("--json", default=None,
                   help="the figures' file (default $OUT/gpu_matrix_game.json where $OUT is set)")
    args = p.parse_args(argv)
    args.device = "cpu" if args.tiny or not torch.cuda.is_available() else "cuda"
    if args.tiny:
        args.chunks, args.engine_s = min(args.chunks, 3), min(args.engine_s, 2.0)
    if args.json is None and os.environ.get("OUT"):
        args.json = os.path.join(os.environ["OUT"], "gpu_matrix_game.json")
    return args


def compile_parts(backend) -> None:
    """``torch.compile`` the per-token work of every block (shapes are fixed per chunk); the
    paged attention and the VAE's causal cache stay eager."""
    for block in backend.model.transformer.blocks:
        block.ffn.compile()
        block.attn2.compile()
        if block.action_model is not None and hasattr(block.action_model, "mouse_mlp"):
            block.action_model.mouse_mlp.compile()


def stream(backend, sync, chunks: int) -> dict:
    steps = len(backend.sigmas)
    keys = frozenset({backend.variant.keys[0]})

    def chunk(state, seed):
        controls = backend.action_space.frame_controls(keys, (12.0, 0.0), backend.chunk_frames)
        start = time.perf_counter()
        (res,) = backend.generate([ChunkJob(state, [1] * backend.chunk_frames, steps, seed,
                                            controls)])
        sync()
        ready = time.perf_counter()
        if res.error is not None:
            raise res.error
        res.stages_ms.update(backend.finish())
        sync()
        return (ready - start) * 1e3, (time.perf_counter() - start) * 1e3, res

    warm = backend.new_state("warm-up", seed=0)
    cold = [chunk(warm, i)[1] for i in range(2)]
    backend.free(warm)
    picture = torch.randint(0, 256, (1, backend.height, backend.width, 3), dtype=torch.uint8,
                            generator=torch.Generator().manual_seed(1)).numpy()
    t0 = time.perf_counter()
    state = backend.new_state("play", seed=1, start_frames=picture)  # its encode counts
    sync()
    start_s = time.perf_counter() - t0
    first_ms, _, _ = chunk(state, 100)
    walls, stages = [], []
    for i in range(1, chunks):
        _, wall, res = chunk(state, 100 + i)
        walls.append(wall)
        stages.append(res.stages_ms)
    backend.free(state)
    return {"cold_chunk_ms": [round(m, 1) for m in cold],
            "time_to_first_frame_s": round(start_s + first_ms / 1e3, 3),
            "start_picture_s": round(start_s, 3),
            "fps": round(backend.chunk_frames * len(walls) / (sum(walls) / 1e3), 2),
            "chunk_ms_median": round(statistics.median(walls), 1),
            "stages_ms_median": {k: round(statistics.median(s[k] for s in stages), 1)
                                 for k in stages[0]}}


def engine_latency(backend, seconds: float) -> dict:
    """Action-to-frame through the engine: mouse-look actions every 300 ms."""
    config = EngineConfig(max_sessions=1, fps=backend.default_fps, steps=len(backend.sigmas),
                          buffer_max_frames=backend.chunk_frames + 2)
    with Engine(backend, config) as engine:
        sid = engine.create_session("play", seed=2).session_id
        slot = engine.subscribe(sid, maxlen=10_000)
        deadline = time.monotonic() + seconds + 30  # the first chunk (start picture) first
        while slot.get(timeout=1.0) is None and time.monotonic() < deadline:
            pass
        end, seq = time.monotonic() + seconds, 0
        while time.monotonic() < end:
            seq += 1
            engine.submit(sid, ActionCommand(seq, time.time() * 1e3, frozenset(),
                                             pointer=(30.0 if seq % 2 else -30.0, 0.0)))
            time.sleep(0.3)
            while slot.get_nowait() is not None:
                pass
        time.sleep(0.5)  # the last action's frame
        figures = engine.metrics()["sessions"][sid]
    return {"action_to_frame_ms": figures["action_to_frame_ms"],
            "engine_fps": round(figures["fps"], 2), "actions": seq}


def run_variant(args, variant: str) -> dict:
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    t0 = time.perf_counter()
    backend = build_backend(variant, args.tiny, dtype, device, max_states=1)
    sync()
    out: dict = {"variant": variant, "build_s": round(time.perf_counter() - t0, 1),
                 "steps": len(backend.sigmas), "height": backend.height,
                 "width": backend.width, "frames_per_chunk": backend.chunk_frames,
                 "attention_backend": backend.attention_backend, "modes": {}}
    modes = {"both": ["eager", "compiled"], "off": ["eager"], "on": ["compiled"]}[args.compile]
    for mode in modes:
        if mode == "compiled":
            compile_parts(backend)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        figures = stream(backend, sync, args.chunks)
        figures.update(engine_latency(backend, args.engine_s))
        if device.type == "cuda":
            figures["peak_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
        out["modes"][mode] = figures
        print(f"matrix-game-2 {variant} {mode}: {figures['fps']} fps, first frame "
              f"{figures['time_to_first_frame_s']} s, action-to-frame p50/p95 "
              f"{figures['action_to_frame_ms']['p50']}/{figures['action_to_frame_ms']['p95']}"
              f" ms, chunk {figures['chunk_ms_median']} ms {figures['stages_ms_median']}",
              flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    results = {"suite": "gpu_matrix_game", "device": args.device, "tiny": args.tiny,
               "goal_fps": 25, "variants": [], "hardware": hardware_info()}
    for variant in args.variants.split(","):
        results["variants"].append(run_variant(args, variant.strip()))
        if args.json:  # written after each variant: a run cut short keeps what it measured
            with open(args.json, "w") as f:
                json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
