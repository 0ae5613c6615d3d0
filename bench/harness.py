"""Building and timing the built-in model for benchmarks, below the engine thread.

* :func:`load_models` — the shipped weights when present, else a random model of the shipped
  architecture (speed does not depend on weight values; every report says which it used).
* :func:`make_generator` — a :class:`engine.backends.builtin.BuiltinBackend` with its own
  copies of the weights (the backend casts them in place), for any chunk size and streaming
  setting.
* :func:`time_stream` — steady-state per-chunk wall time of B states generated together.
* :func:`naive_recompute_ms` — the no-KV-cache baseline: every denoising step re-runs the whole
  context window plus the chunk through the dense block-causal forward.

Every measurement here is single-process wall time (``time.perf_counter``).
"""

from __future__ import annotations

import copy
import random
import statistics
import time
from dataclasses import dataclass

import torch

from worldstream.engine.backends.builtin import BuiltinBackend, BuiltinConfig
from worldstream.engine.backends.sampler import denoise
from worldstream.engine.core.backend import ChunkJob
from worldstream.engine.models.builtin.attention import (
    DenseContext,
    block_causal_frame_mask,
    expand_frame_mask,
)
from worldstream.engine.models.builtin.autoencoder import build_autoencoder
from worldstream.engine.models.builtin.loading import (
    BUILTIN_DIR,
    load_autoencoder,
    load_colour_prior,
    load_world_model,
)
from worldstream.engine.models.builtin.world_dit import WorldDiT
from worldstream.engine.worlds.actions import NUM_ACTIONS

#: the architecture benchmarked when the trained transformer is not there yet (the shipped one)
RANDOM_MODEL = {"dim": 128, "depth": 6, "num_heads": 4, "chunk_frames": 1}
#: a model small enough for tests and ``--smoke`` runs (numbers meaningless, code path real)
SMOKE_MODEL = {"dim": 32, "depth": 1, "num_heads": 2, "chunk_frames": 1}
PROMPT = "grassy meadow with a river"


@dataclass
class Models:
    """The world transformer and autoencoder, and where their weights came from."""

    model: WorldDiT
    autoencoder: torch.nn.Module
    weights: str  # "trained" | "random"

    def describe(self) -> dict:
        """Model facts for a report: parameters, width, depth, heads, resolution, weights."""
        c = self.model.config
        side = c.image_size
        return {"name": "builtin WorldDiT + AutoencoderTiny", "weights": self.weights,
                "params_m": round(sum(p.numel() for p in self.model.parameters()) / 1e6, 3),
                "ae_params_m": round(sum(p.numel() for p in self.autoencoder.parameters())
                                     / 1e6, 3),
                "dim": c.dim, "depth": c.depth, "heads": c.num_heads,
                "trained_chunk_frames": c.chunk_frames,
                "tokens_per_frame": self.model.tokens_per_frame,
                "resolution": f"{side}x{side}"}


def load_models(weights: str = "auto", smoke: bool = False,
                world: str = "landscape") -> Models:
    """``weights``: ``trained`` (FileNotFoundError when missing), ``random``, or ``auto``
    (trained when the world's ``assets/<world>/{transformer,vae}`` both load, else random).
    ``smoke`` builds the tiny random :data:`SMOKE_MODEL` instead. ``world``: ``landscape``
    (``assets/builtin``) or ``avatar`` (``assets/avatar``, its factored action ids)."""
    from worldstream.engine.worlds.catalog import world as world_spec

    if weights not in ("auto", "trained", "random"):
        raise ValueError(f"weights must be auto, trained or random, got {weights!r}")
    spec = world_spec(world)
    folder = BUILTIN_DIR if world == "landscape" else spec.assets
    if not smoke and weights != "random":
        try:
            return Models(load_world_model(folder / "transformer"),
                          load_autoencoder(folder / "vae"), "trained")
        except FileNotFoundError:
            if weights == "trained":
                raise
    torch.manual_seed(0)
    arch = dict(SMOKE_MODEL if smoke else RANDOM_MODEL, num_actions=spec.num_actions,
                action_factors=spec.action_factors)
    ae = build_autoencoder(width=8 if smoke else 32)
    return Models(WorldDiT(**arch).eval(), ae.eval(), "random")


def model_for_chunk(model: WorldDiT, chunk_frames: int) -> WorldDiT:
    """A copy of ``model`` whose config says ``chunk_frames`` (the generator's chunk size);
    same weights, so chunk sizes it was not trained for are timed at the same cost."""
    config = {k: v for k, v in model.config.items() if not k.startswith("_")}
    config["chunk_frames"] = chunk_frames
    copy_ = WorldDiT(**config)
    copy_.load_state_dict(model.state_dict())
    return copy_.eval()


def make_generator(models: Models, chunk_frames: int | None = None, **config) -> BuiltinBackend:
    """A generator over private copies of the weights; ``config`` -> :class:`BuiltinConfig`
    (``dtype`` may be given as ``"fp32"``/``"bf16"``)."""
    if isinstance(config.get("dtype"), str):
        config["dtype"] = {"fp32": torch.float32, "bf16": torch.bfloat16}[config["dtype"]]
    config.setdefault("colour_prior", load_colour_prior())  # the landscape's streaming setting
    f = chunk_frames or models.model.config.chunk_frames
    return BuiltinBackend(model_for_chunk(models.model, f), copy.deepcopy(models.autoencoder),
                          BuiltinConfig(**config))


def _jobs(states, frames: int, steps: int, rng: random.Random) -> list[ChunkJob]:
    return [ChunkJob(s, [rng.randrange(NUM_ACTIONS) for _ in range(frames)], steps)
            for s in states]


def time_stream(gen: BuiltinBackend, *, sessions: int = 1, steps: int = 4,
                warm_chunks: int | None = None, chunks: int = 5, seed: int = 0) -> dict:
    """Generate ``sessions`` streams together (one batch per call); after ``warm_chunks``
    untimed chunks (default: enough to fill the retained memory), time ``chunks`` calls.

    Returns ``{"chunk_ms": median wall ms per batch call, "chunk_ms_all": [...],
    "stages_ms": {stage: median ms}, "frames_per_call", "fps": frames per second}``.
    """
    rng = random.Random(seed)
    cfg = gen.config
    if warm_chunks is None:
        warm_chunks = cfg.memory_chunks + (1 if cfg.sink else 0) + 1
    states = [gen.new_state(PROMPT, seed + i) for i in range(sessions)]
    try:
        for _ in range(warm_chunks):
            _check(gen.generate(_jobs(states, gen.chunk_frames, steps, rng)))
        times, stages = [], []
        for _ in range(chunks):
            jobs = _jobs(states, gen.chunk_frames, steps, rng)
            t0 = time.perf_counter()
            results = gen.generate(jobs)
            times.append((time.perf_counter() - t0) * 1e3)
            _check(results)
            stages.append(results[0].stages_ms)
    finally:
        for s in states:
            gen.free(s)
    median = statistics.median(times)
    frames = sessions * gen.chunk_frames
    return {"chunk_ms": median, "chunk_ms_all": times,
            "stages_ms": {k: statistics.median(s[k] for s in stages) for k in stages[0]},
            "frames_per_call": frames, "fps": frames * 1e3 / median}


def _check(results) -> None:
    for r in results:
        if r.error is not None:
            raise r.error


@torch.no_grad()
def naive_recompute_ms(models: Models, *, context_frames: int, chunk_frames: int, steps: int,
                       dtype: torch.dtype = torch.float32, repeats: int = 3,
                       seed: int = 0) -> dict:
    """Wall ms of one chunk without a KV cache: each of ``steps`` denoising steps runs the
    dense block-causal forward over ``context_frames`` clean frames plus the noisy chunk
    (the attention the cache serves, recomputed), then the chunk is decoded as in the engine.

    Returns ``{"chunk_ms": median, "chunk_ms_all": [...], "model_ms": median model part}``.
    """
    model = model_for_chunk(models.model, chunk_frames).to(dtype)
    ae = copy.deepcopy(models.autoencoder).to(dtype)
    c = model.config
    g = torch.Generator().manual_seed(seed)
    t = context_frames + chunk_frames
    shape = (1, t, c.latent_channels, c.latent_size, c.latent_size)
    context = torch.randn(shape, generator=g)
    # each frame's memory base: the previous frame stands in for it (same cost)
    base = torch.cat([torch.zeros_like(context[:, :1]), context[:, :-1]], dim=1).to(dtype)
    base_sigma = torch.full((1, t), 0.05)
    known = torch.ones(1, t, 2, c.latent_size, c.latent_size, dtype=dtype)
    actions = torch.randint(0, c.num_actions, (1, t), generator=g)
    text = torch.randn(1, t, c.text_dim, generator=g)
    pos = torch.arange(t)[None]
    mask = expand_frame_mask(block_causal_frame_mask(t, chunk_frames), model.tokens_per_frame)
    ctx = DenseContext(mask)
    noise = torch.randn((1, chunk_frames, *shape[2:]), generator=g)

    def predict_x0(x, sigma):
        seq = torch.cat([context[:, :context_frames], x], dim=1).to(dtype)
        sig = torch.cat([torch.full((1, context_frames), 0.05),
                         torch.full((1, chunk_frames), sigma)], dim=1)
        return model(seq, base, base_sigma, known, sig, actions, text, pos, ctx,
                     skip=base if c.skip_source else None,
                     pose=torch.zeros(1, t, 2) if c.pose_path else None)[:, context_frames:]

    totals, model_part = [], []
    for i in range(repeats + 1):  # the first run is warm-up
        t0 = time.perf_counter()
        x0 = denoise(predict_x0, noise, steps)
        t1 = time.perf_counter()
        ae.decoder(x0.reshape(-1, *shape[2:]).to(dtype))
        t2 = time.perf_counter()
        if i:
            totals.append((t2 - t0) * 1e3)
            model_part.append((t1 - t0) * 1e3)
    return {"chunk_ms": statistics.median(totals), "chunk_ms_all": totals,
            "model_ms": statistics.median(model_part)}


def add_common_args(parser) -> None:
    """Options every model suite takes: ``--threads``, ``--weights``, ``--smoke``, ``--json``."""
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads (default: torch's choice); use 1 on a shared CPU")
    parser.add_argument("--weights", choices=("auto", "trained", "random"), default="auto",
                        help="shipped weights, or a random model of the same architecture")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny random model and short runs: checks the code path, "
                             "numbers are meaningless")
    parser.add_argument("--json", default=None, help="also write the result JSON here")


def apply_common_args(args) -> None:
    """Thread count and quiet library logs, before any model is built."""
    import diffusers

    if args.threads is not None:
        if args.threads < 1:
            raise SystemExit("--threads must be >= 1")
        torch.set_num_threads(args.threads)
    diffusers.utils.logging.set_verbosity_error()
