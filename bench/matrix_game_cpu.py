"""Matrix-Game 2.0 at full size on a CPU: one chunk through the engine's backend with random
weights, so that the first GPU run is not the first time the full shapes meet.

    python -m bench matrix_game_cpu                 # full size: ~8 GB of memory, minutes
    python -m bench matrix_game_cpu --tiny          # tiny random shapes (a smoke run, seconds)

The published sizes (30 blocks of 1536, action modules in 0-14, 36 input channels, the Wan2.1
VAE, the CLIP ViT-H/14 visual tower) are built on the meta device and filled with random
values in the compute dtype (bf16 where the CPU has native bf16, else fp32), then one stream
of one chunk (3 latent frames at 352x640: 2,640 tokens) runs at the variant's distilled steps,
its cache fill and its decode. Printed: seconds per stage, the chunk's frames and the peak
memory (resident set).
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time

import torch

from worldstream.bench.common import hardware_info
from worldstream.engine.backends.matrix_game.backend import (
    MatrixGameBackend,
    MatrixGameBackendConfig,
)
from worldstream.engine.core.backend import ChunkJob
from worldstream.engine.models.matrix_game.config import ActionConfig, MatrixGameConfig, get_variant
from worldstream.engine.models.matrix_game.image_encoder import ImageEncoder, VisionConfig
from worldstream.engine.models.matrix_game.loading import assign_weights
from worldstream.engine.models.matrix_game.transformer import build_transformer

#: a tiny model of the real structure (3 blocks, action modules in 0-1) for --tiny
TINY = MatrixGameConfig(
    dim=32, ffn_dim=48, freq_dim=16, in_dim=12, out_dim=4, num_heads=2, num_layers=3,
    image_dim=8, action=ActionConfig(blocks=(0, 1), hidden_size=8, img_hidden_size=32,
                                     keyboard_hidden_dim=16, mouse_hidden_dim=16, heads_num=2,
                                     rope_dim_list=(4, 2, 2)))
TINY_VAE = dict(base_dim=8, z_dim=4, dim_mult=[1, 2, 2], num_res_blocks=1,
                temperal_downsample=[True, True], latents_mean=[0.0] * 4, latents_std=[1.0] * 4)
TINY_VISION = VisionConfig(image_size=28, patch_size=14, dim=8, num_heads=2, num_layers=2,
                           out_dim=4)


def _random_(module: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Fill a module's parameters in place: norm weights 1, the rest N(0, 0.02)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if "norm" in name and name.endswith(("weight", "gamma")):
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float32).to(p.dtype) * 0.02)
    return module


def random_parts(variant: str, tiny: bool, dtype: torch.dtype, device: torch.device):
    """``(transformer, config, vae, image_encoder)`` with random weights, each built on the
    meta device and given its tensors once (no full-size fp32 copy)."""
    from diffusers import AutoencoderKLWan

    config = get_variant(variant).config(TINY if tiny else None)
    with torch.device("meta"):
        shapes = build_transformer(config).state_dict()
        vae = AutoencoderKLWan(**(TINY_VAE if tiny else {}))
        encoder = ImageEncoder(TINY_VISION if tiny else None)
    g = torch.Generator().manual_seed(0)
    state = {k: (torch.ones(v.shape, dtype=dtype) if "norm" in k and k.endswith("weight")
                 else (torch.randn(v.shape, generator=g) * 0.02).to(dtype))
             for k, v in shapes.items()}
    transformer = assign_weights(config, state, dtype, device)
    del state
    vae = _random_(vae.to_empty(device=device).to(dtype), 1).eval()
    encoder = _random_(encoder.to_empty(device=device).to(dtype), 2).eval()
    return transformer, config, vae, encoder


def build_backend(variant: str, tiny: bool, dtype: torch.dtype, device: torch.device,
                  **settings) -> MatrixGameBackend:
    """The backend over :func:`random_parts` (``settings``: its config fields)."""
    size = dict(height=32, width=32) if tiny else {}
    cfg = MatrixGameBackendConfig(variant=variant, device=str(device), dtype=dtype,
                                  **size, **settings)
    return MatrixGameBackend(*random_parts(variant, tiny, dtype, device), cfg)


def peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tiny", action="store_true", help="tiny random shapes (a smoke run)")
    p.add_argument("--variant", default="universal", choices=["universal", "gta_drive",
                                                              "templerun"])
    p.add_argument("--dtype", default=None, choices=["bfloat16", "float32"],
                   help="default: bfloat16 where the CPU has native bf16, else float32")
    p.add_argument("--json", default=None, help="also write the figures to this file")
    args = p.parse_args(argv)
    native_bf16 = torch.backends.cpu.get_cpu_capability() in ("AVX512", "AVX512_BF16") and \
        "avx512_bf16" in open("/proc/cpuinfo").read()
    dtype = getattr(torch, args.dtype or ("bfloat16" if native_bf16 else "float32"))
    device = torch.device("cpu")
    t0 = time.perf_counter()
    # NOTE: one state, one retained chunk: the KV and action pools are then ~2 GB at full size;
    # 2 condition frames (5 encoded video frames): the picture's VAE encode is not the point
    backend = build_backend(args.variant, args.tiny, dtype, device, max_states=1,
                            memory_chunks=1, cond_frames=2, attention_backend="reference")
    build_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    state = backend.new_state("play", seed=0)
    start_s = time.perf_counter() - t0
    controls = backend.action_space.frame_controls(frozenset({backend.variant.keys[0]}),
                                                   (6.0, 0.0), backend.chunk_frames)
    steps = len(backend.sigmas)
    t0 = time.perf_counter()
    with torch.no_grad():
        (result,) = backend.generate([ChunkJob(state, [1] * backend.chunk_frames, steps, 0,
                                               controls)])
    chunk_s = time.perf_counter() - t0
    if result.error is not None:
        raise result.error
    fill_ms = backend.finish()["cache_fill"]
    figures = {
        "suite": "matrix_game_cpu", "variant": args.variant, "tiny": args.tiny,
        "dtype": str(dtype).removeprefix("torch."), "threads": torch.get_num_threads(),
        "frames": list(result.frames.shape), "steps": steps,
        "build_s": round(build_s, 2), "start_picture_s": round(start_s, 2),
        "chunk_s": round(chunk_s, 2), "cache_fill_s": round(fill_ms / 1e3, 2),
        "stages_ms": {k: round(v, 1) for k, v in result.stages_ms.items()},
        "peak_rss_gib": round(peak_rss_gib(), 2),
        "kv_and_action_pools_gib": round((backend.k_pool.nbytes + backend.v_pool.nbytes
                                          + backend.action_pools.nbytes()) / 2**30, 3),
        "hardware": hardware_info(),
    }
    print(f"matrix_game_cpu {args.variant}{' (tiny)' if args.tiny else ''}: one chunk of "
          f"{result.frames.shape[0]} frames {result.frames.shape[1]}x{result.frames.shape[2]} "
          f"in {chunk_s:.1f} s ({steps} steps, {figures['dtype']}) + cache fill "
          f"{fill_ms / 1e3:.1f} s; start picture {start_s:.1f} s; peak memory "
          f"{figures['peak_rss_gib']:.2f} GiB")
    print(json.dumps(figures))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
