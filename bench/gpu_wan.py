"""Wan2.1-T2V-1.3B causal streaming speed: 4-step chunked generation at 832x480 (<= 8 min on
one H100/H200; most of it is building the model).

    python -m bench gpu_wan --json gpu_wan.json     # on a CUDA machine (bf16, auto attention)
    python -m bench gpu_wan --tiny                  # anywhere: tiny random shapes on CPU

The real 1.3B transformer (30 layers, 12 heads x 128, ffn 8960) and Wan VAE are built with
random weights (speed does not depend on weight values) and driven through the engine's
``WanBackend`` exactly as a session is: chunks of 3 latent frames (12 frames), KV in
pages of one latent frame, cache fill after each chunk, streaming VAE decode. The UMT5 text
encoder is replaced by random 512 x 4096 states (it runs once per prompt, not per chunk).

A warm-up stream first (kernel compilation, allocator), then a fresh stream: printed are time
to first frame (first chunk of the fresh stream, denoise + fill + decode), fps over the
following chunks, per-stage median ms, the cost of a chunk right after a prompt switch (window
recache), peak memory and the attention backend, beside Self-Forcing's and LongLive's
published H100 figures.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch
from diffusers import AutoencoderKLWan

from worldstream.bench.common import hardware_info
from worldstream.engine.backends.wan.backend import WanBackend, WanConfig
from worldstream.engine.core.backend import ChunkJob
from worldstream.engine.models.wan.loading import build_transformer

#: Wan2.1-T2V-1.3B transformer (diffusers naming)
WAN_1_3B = dict(patch_size=(1, 2, 2), num_attention_heads=12, attention_head_dim=128,
                in_channels=16, out_channels=16, text_dim=4096, freq_dim=256, ffn_dim=8960,
                num_layers=30, cross_attn_norm=True, qk_norm="rms_norm_across_heads", eps=1e-6)
TINY_TRANSFORMER = dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=16,
                        in_channels=4, out_channels=4, text_dim=8, freq_dim=16, ffn_dim=32,
                        num_layers=2)
TINY_VAE = dict(base_dim=8, z_dim=4, dim_mult=[1, 2, 2], num_res_blocks=1,
                temperal_downsample=[True, True], latents_mean=[0.0] * 4, latents_std=[1.0] * 4)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tiny", action="store_true", help="tiny random shapes on CPU (smoke run)")
    p.add_argument("--device", default=None, help="default: cuda if present, else cpu")
    p.add_argument("--dtype", default=None, choices=["bfloat16", "float32"])
    p.add_argument("--attention", default="auto", help="auto | reference | flex | triton")
    p.add_argument("--chunks", type=int, default=10, help="chunks of the measured stream")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--height", type=int, default=480)
    p.add_argument("--width", type=int, default=832)
    p.add_argument("--window-chunks", type=int, default=6)
    p.add_argument("--sink", action="store_true")
    p.add_argument("--json", default=None, help="write the figures to this file")
    args = p.parse_args(argv)
    if args.tiny:
        args.device = args.device or "cpu"
        args.height = args.width = 32
        args.chunks = min(args.chunks, 3)
        args.window_chunks = min(args.window_chunks, 2)
    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if args.chunks < 2:
        p.error("--chunks must be >= 2 (the first chunk is the time to first frame)")
    return args


def build(args) -> WanBackend:
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype) if args.dtype else (
        torch.bfloat16 if device.type == "cuda" else torch.float32)
    t_cfg, v_cfg = (TINY_TRANSFORMER, TINY_VAE) if args.tiny else (WAN_1_3B, {})
    torch.manual_seed(0)
    # random init directly on the device (fast for 1.3B); fp32 where diffusers keeps it
    transformer = build_transformer(t_cfg, None, dtype, device)
    with torch.device(device):
        vae = AutoencoderKLWan(**v_cfg).to(dtype).eval()
    text_dim = t_cfg["text_dim"]

    def encode(prompt: str) -> torch.Tensor:  # stands in for UMT5 (once per prompt)
        g = torch.Generator().manual_seed(len(prompt))
        return torch.randn(512, text_dim, generator=g).to(device, dtype)

    cfg = WanConfig(height=args.height, width=args.width, window_chunks=args.window_chunks,
                    memory_chunks=max(args.window_chunks, 8), sink=args.sink, max_states=1,
                    max_batch=1, dtype=dtype, device=args.device,
                    attention_backend=args.attention)
    return WanBackend(transformer, vae, encode, cfg)


def run(args) -> dict:
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    t0 = time.perf_counter()
    be = build(args)
    sync()
    build_s = time.perf_counter() - t0

    def chunk(state, seed):
        """A chunk as a session gets it: generated and delivered, then the deferred cache fill
        (timed as the ``cache_fill`` stage; the wall time covers both)."""
        start = time.perf_counter()
        res = be.generate([ChunkJob(state, [0] * be.chunk_frames, args.steps, seed)])[0]
        sync()
        if res.error is not None:
            raise res.error
        res.stages_ms.update(be.finish())
        sync()
        return (time.perf_counter() - start) * 1e3, res

    warm = be.new_state("warm-up stream", seed=0)
    cold_ms = [chunk(warm, i)[0] for i in range(2)]
    be.free(warm)
    if args.device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    state = be.new_state("a drone flight over a coastline at sunset", seed=1)
    first_ms, _ = chunk(state, 100)
    walls, stages = [], []
    for i in range(1, args.chunks):
        ms, res = chunk(state, 100 + i)
        walls.append(ms)
        stages.append(res.stages_ms)
    be.set_prompt(state, "the same coastline in a thunderstorm")
    switch_ms, _ = chunk(state, 999)
    frames = be.chunk_frames * len(walls)
    out = {
        "device": args.device, "dtype": str(be.config.dtype).replace("torch.", ""),
        "attention_backend": be.attention_backend, "height": be.height, "width": be.width,
        "steps": args.steps, "latent_frames_per_chunk": be.config.latent_frames,
        "frames_per_chunk": be.chunk_frames, "window_chunks": be.config.window_chunks,
        "sink": be.config.sink, "tokens_per_frame": be.page_size,
        "build_s": round(build_s, 2), "cold_chunk_ms": [round(m, 1) for m in cold_ms],
        "time_to_first_frame_s": round(first_ms / 1e3, 3),
        "fps": round(frames / (sum(walls) / 1e3), 2),
        "chunk_ms_median": round(statistics.median(walls), 1),
        "stages_ms_median": {k: round(statistics.median(s[k] for s in stages), 1)
                             for k in stages[0]},
        "prompt_switch_chunk_ms": round(switch_ms, 1),
        "kv_pool_gib": round(2 * be.k_pool.numel() * be.k_pool.element_size() / 2**30, 2),
        "hardware": hardware_info(),
    }
    if args.device.startswith("cuda"):
        out["peak_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    out = run(args)
    print(f"wan-causal {out['width']}x{out['height']} {out['dtype']} {out['steps']} steps "
          f"attention={out['attention_backend']}: {out['fps']} fps, first frame "
          f"{out['time_to_first_frame_s']} s, chunk {out['chunk_ms_median']} ms "
          f"({', '.join(f'{k} {v}' for k, v in out['stages_ms_median'].items())} ms), "
          f"after prompt switch {out['prompt_switch_chunk_ms']} ms "
          f"[Self-Forcing H100: 17 fps / 0.69 s; LongLive: 20.7 fps]")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
