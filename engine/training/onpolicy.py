"""On-policy fine-tuning of the built-in world model (Self-Forcing / DAgger style).

The world model is trained with spatial-memory bases replayed from the autoencoder's
reconstructions of *real* frames (:func:`engine.training.latents.memory_bases`), but in a stream
memory holds the model's *own* output: new ground is generated next to drifted content, and the
colour error compounds in space (exposure bias; ``degrade_bases`` is only a proxy for it). This
module closes the gap:

1. :func:`collect_rollouts` rolls the current model out with the real inference path
   (:class:`engine.backends.builtin.BuiltinBackend` with the world's streaming settings: memory
   read, denoise, guidance, cache fill, pixel residual, memory write) on recorded training
   episodes: their first frame, actions, prompts and scene switches. The camera is *forced*
   onto the simulator's recorded path (:class:`ForcedCamera`), so every generated frame is
   aligned with a true frame; the model's own camera path is kept alongside as a check.
2. :func:`onpolicy_bases` replays the generated frames through the spatial memory exactly as
   :func:`~engine.training.latents.memory_bases` replays the reconstructions, and encodes the
   bases: what the generator read, frame for frame.
3. :func:`onpolicy_loss` trains on those bases and on the generator's own latents as temporal
   context, supervised by the simulator's true latents; :func:`finetune_onpolicy` mixes such
   rows with the original recipe (:func:`engine.training.train_world.world_loss`) and refreshes
   the rollouts with the current weights every ``refresh_every`` steps.

Any world with recorded shards works (``engine.worlds.catalog``): the landscape, whose memory
holds the model's own drifted ground, and the avatar, whose memory is the stream's true first
frame but whose temporal context is the model's own frames (teacher-forced on the simulator's
frames its head turns read right on every frame of three held-out episodes, in its free
rollouts on 0.72 of them: ``assets/avatar/MODEL_CARD.md``).
"""

from __future__ import annotations

import contextlib
import copy
import json
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from worldstream.engine.backends.builtin import BuiltinBackend, BuiltinConfig
from worldstream.engine.core.backend import ChunkJob
from worldstream.engine.models.builtin.attention import (
    DenseContext,
    block_causal_frame_mask,
    expand_frame_mask,
)
from worldstream.engine.models.builtin.loading import load_colour_prior
from worldstream.engine.models.builtin.spatial_memory import SETTLE_PX
from worldstream.engine.models.builtin.world_dit import CameraDynamics, WorldDiT
from worldstream.engine.models.builtin.world_noise import training_noise
from worldstream.engine.training.common import (
    autocast,
    pick_device,
    seed_everything,
)
from worldstream.engine.training.latents import (
    LatentDataset,
    ae_encode,
    attach_poses,
    memory_bases,
)
from worldstream.engine.training.train_world import (
    change_map,
    export_ema,
    noised_skip,
    previous_frames,
    recipe_clips,
    resume_run,
    save_run,
    world_loss,
)
from worldstream.engine.worlds.catalog import make_base_warp
from worldstream.engine.worlds.recorder import PROMPTS, load_shard


@dataclass
class EpisodeSpec:
    """What :func:`collect_rollouts` replays, for ``E`` recorded episodes of ``L`` frames:
    ``first (E, F, S, S, 3)`` uint8 the true first chunk (the stream's start frames),
    ``actions (E, L)`` int64, ``prompt (E, L)`` int64 index into ``PROMPTS`` (the prompt in
    force at each frame), ``switch (E, L)`` bool (a scene switch at that frame), ``camera
    (E, L, 2)`` int64 the simulator's crop origins (world px), ``index (E,)`` int64 each
    episode's row in the :class:`LatentDataset`; ``prompt`` indexes the world's prompt table
    (the landscape's ``recorder.PROMPTS``, the avatar's ``looks.PROMPTS``)."""

    first: np.ndarray
    actions: np.ndarray
    prompt: np.ndarray
    switch: np.ndarray
    camera: np.ndarray
    index: np.ndarray


def load_episodes(shard_dirs: list[Path], index: np.ndarray, chunk_frames: int = 1) -> EpisodeSpec:
    """Episodes ``index`` (rows of the concatenated shards, as in ``encode_shards``)."""
    per = [load_shard(d) for d in shard_dirs]
    sizes = np.cumsum([0] + [p["actions"].shape[0] for p in per])
    rows = {k: [] for k in ("first", "actions", "prompt", "switch", "camera")}
    for g in np.asarray(index):
        s = int(np.searchsorted(sizes, g, side="right") - 1)
        e = int(g - sizes[s])
        rows["first"].append(np.array(per[s]["frames"][e, :chunk_frames]))
        for k in ("actions", "prompt", "switch", "camera"):
            rows[k].append(np.asarray(per[s][k][e]))
    return EpisodeSpec(
        np.stack(rows["first"]),
        np.stack(rows["actions"]).astype(np.int64),
        np.stack(rows["prompt"]).astype(np.int64),
        np.stack(rows["switch"]).astype(bool),
        np.stack(rows["camera"]).astype(np.int64),
        np.asarray(index, dtype=np.int64),
    )


class ForcedCamera(torch.nn.Module):
    """Stands in for a model's :class:`CameraDynamics` while collecting: ``rollout`` returns
    the next displacement queued in ``forced`` (``(T, 2)`` px, FIFO, one entry per
    ``rollout`` call, i.e. per chunk and state in the generator's batch order) instead of the
    predicted one, and logs the predicted one in ``predicted`` (the check). The velocity state
    stays the model's own."""

    def __init__(self, inner: CameraDynamics):
        super().__init__()
        self.inner = inner
        self.forced: deque[torch.Tensor] = deque()
        self.predicted: list[torch.Tensor] = []

    def forward(self, vel: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        return self.inner(vel, actions)

    @torch.no_grad()
    def rollout(self, vel: torch.Tensor, actions: torch.Tensor):
        disp, v = self.inner.rollout(vel, actions)
        self.predicted.append(disp.detach().cpu())
        if not self.forced:
            raise RuntimeError("ForcedCamera: no displacement queued for this chunk")
        return self.forced.popleft().to(disp), v


@contextlib.contextmanager
def forced_camera(model: WorldDiT):
    """Swap ``model.camera`` for a :class:`ForcedCamera` for the duration."""
    inner = model.camera
    wrapper = ForcedCamera(inner)
    model.camera = wrapper
    try:
        yield wrapper
    finally:
        model.camera = inner


@dataclass
class Rollouts:
    """Free rollouts of ``E`` episodes: ``frames (E, L, S, S, 3)`` uint8 what the generator
    showed (frame 0..F-1: the true start chunk), ``latents (E, L, C, h, w)`` float32 the
    model-space clean latents its cache fill consumed (the temporal context it attended to),
    ``camera (E, L, 2)`` int64 the crop origins the stream used, world px: the recorded path,
    except that the start chunk's frames all sit where its last one does (the stream places
    given start frames at one position; with 1-frame chunks the recorded path exactly),
    ``camera_err (E, L, 2)`` float64 px, the model's own camera path minus the forced one,
    both relative to the start chunk (the check)."""

    frames: np.ndarray
    latents: torch.Tensor
    camera: np.ndarray
    camera_err: np.ndarray


@torch.no_grad()
def collect_rollouts(
    gen: BuiltinBackend, eps: EpisodeSpec, steps: int = 4, seed: int = 0,
    prompts: Sequence[str] = PROMPTS,
) -> Rollouts:
    """Roll ``gen`` out on all of ``eps`` at once (one batched ``generate`` per chunk; the
    generator's ``max_states`` must be >= E): start from the true first chunk under the
    episode's first prompt, then each chunk's actions, with ``set_prompt`` before a chunk
    holding a scene switch (as the stream does: recache + new memory epoch) and the camera
    forced onto the recorded path; ``prompts`` the table ``eps.prompt`` indexes. Seeds:
    ``seed * 100_003 + episode index``. ValueError when
    ``gen`` restyles more than once per switch (the bases are replayed by ``memory_bases``,
    one memory epoch per switch)."""
    if gen.config.restyle_chunks != 1:
        raise ValueError("on-policy rollouts need restyle_chunks=1 (memory_bases replays one "
                         f"memory epoch per switch), got {gen.config.restyle_chunks}")
    f = gen.chunk_frames
    e, n = eps.actions.shape
    n = n // f * f
    states = [
        gen.new_state(
            prompts[eps.prompt[i, 0]], seed * 100_003 + int(eps.index[i]), start_frames=eps.first[i]
        )
        for i in range(e)
    ]
    frames = np.empty((e, n, gen.height, gen.width, 3), np.uint8)
    frames[:, :f] = eps.first
    camera = eps.camera[:, :n].copy()
    camera[:, : f - 1] = camera[:, f - 1 : f]
    true_path = (camera - camera[:, :1]).astype(np.float64)
    model_path = np.zeros((e, n, 2))
    latents = None
    try:
        with forced_camera(gen.model) as cam:
            for c in tqdm(range(1, n // f), desc="on-policy rollout", unit="chunk", leave=False):
                span = slice(c * f, (c + 1) * f)
                jobs = []
                for i, state in enumerate(states):
                    if eps.switch[i, span].any():
                        gen.set_prompt(state, prompts[eps.prompt[i, span][-1]])
                    # the chunk's displacements from the last frame of the previous chunk
                    disp = np.diff(true_path[i, c * f - 1 : (c + 1) * f], axis=0)
                    cam.forced.append(torch.as_tensor(disp, dtype=torch.float32))
                    jobs.append(ChunkJob(state, list(map(int, eps.actions[i, span])), steps))
                cam.predicted.clear()
                results = gen.generate(jobs)
                for i, res in enumerate(results):
                    if res.error:
                        raise res.error
                    frames[i, span] = res.frames
                    pred = cam.predicted[i].double().numpy()
                    model_path[i, span] = model_path[i, c * f - 1] + np.cumsum(pred, axis=0)
                gen.finish()  # cache fill + memory write, so history holds this chunk
                if latents is None:
                    lat0 = [s.history[0].latents for s in states]
                    latents = torch.empty(e, n, *lat0[0].shape[1:])
                    latents[:, :f] = torch.stack(lat0).float().cpu()
                for i, state in enumerate(states):
                    latents[i, span] = state.history[-1].latents.float().cpu()
    finally:
        for state in states:
            gen.free(state)
    return Rollouts(frames, latents, camera, model_path - true_path)


@torch.no_grad()
def onpolicy_bases(
    ae, rolls: Rollouts, eps: EpisodeSpec, chunk_frames: int, device: torch.device,
    model_config, settle_px: int = SETTLE_PX,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Memory bases of the generated frames, replayed as ``memory_bases`` replays the
    reconstructions, with the view box and base warp of the model (``model_config``, a
    :class:`WorldDiT` config) and the settle distance of the stream that generated them
    (``settle_px``, ``BuiltinConfig.memory_settle_px``), as the engine reads them: ``base (E,
    L, C, h, w)`` float16 raw autoencoder latents (encoded as the training data was,
    :func:`ae_encode`) and ``known (E, L, 2, h, w)`` uint8 (fractions × 255; equal to the
    original data's, since they depend only on the camera path and switches)."""
    bases, knowns = [], []
    n = rolls.frames.shape[1]
    mc = model_config
    warp = make_base_warp(mc.base_warp, mc.image_size) if mc.base_warp else None
    for i in range(len(rolls.frames)):
        rgb, planes = memory_bases(
            rolls.frames[i], rolls.camera[i], eps.switch[i, :n], chunk_frames, mc.view_box,
            warp, eps.actions[i, :n], settle_px,
        )
        bases.append(ae_encode(ae, rgb, device).cpu().half())
        knowns.append(torch.as_tensor(planes * 255).round().to(torch.uint8))
    return torch.stack(bases), torch.stack(knowns)


def onpolicy_target(
    z: torch.Tensor, zb_own: torch.Tensor, zb_orig: torch.Tensor, known: torch.Tensor
) -> torch.Tensor:
    """The x0 target of a frame whose memory holds the model's own output, model space,
    ``(B, F, C, h, w)`` each (``known (B, F, 2, h, w)`` fractions, plane 0 = current).

    Where memory holds nothing of the current prompt (new ground, stale ground to restyle) the
    target is the simulator's frame ``z``: that is what must be learned next to drifted
    content. Where memory holds current content, the engine *wants* the model to keep it
    (revisit consistency; the pixel residual shows memory plus the model's change), even if it
    drifted: the target there is the own memory plus the true change the world made to its
    remembered ground (animation, the sprite: ``z − zb_orig``, with ``zb_orig`` the base read
    from reconstructions of real frames). Supervising those pixels with ``z`` instead would
    teach the model to replace remembered detail it cannot know with a blur."""
    cur = known[:, :, :1]
    return z + cur * (zb_own - zb_orig)


def onpolicy_loss(
    model: WorldDiT,
    lat: torch.Tensor,
    own_lat: torch.Tensor,
    base_orig: torch.Tensor,
    base_own: torch.Tensor,
    known: torch.Tensor,
    actions: torch.Tensor,
    txt: torch.Tensor,
    gen: torch.Generator,
    chunk_frames: int,
    ctx_sigma_max: float,
    ctx: DenseContext,
    device: torch.device,
    new_weight: float = 4.0,
    change_weight: float = 0.0,
    skip: torch.Tensor | None = None,
    pose: torch.Tensor | None = None,
) -> torch.Tensor:
    """Flow-matching x0 loss on on-policy clips, all rows inference-like. Raw autoencoder
    latents ``(B, F, C, h, w)``: ``lat`` the simulator's frames, ``own_lat`` the generator's
    frames (the context its KV cache held), ``base_orig``/``base_own`` the memory bases from
    real reconstructions / from the generator's output; ``known (B, F, 2, h, w)`` in [0, 1],
    ``actions (B, F)``, ``txt (B, F, 384)``.

    Chunks before a random chunk k >= 1 are the generator's own latents at a context level
    σ ~ U[0, ctx_sigma_max] and carry no loss (at inference the cache holds its own output,
    not the simulator's; the true neighbours of new ground must not leak in through the
    context); chunks from k on are the true latents at logit-normal σ, supervised with
    :func:`onpolicy_target`, weighted ``1 + new_weight`` where memory held nothing current,
    plus ``change_weight`` times :func:`~engine.training.train_world.change_map` of the
    target against the generator's base (as :func:`~engine.training.train_world.world_loss`:
    the avatar's head, face and mouth are a few percent of the pixels). Bases are noised at
    U[0, ctx_sigma_max] as in the original recipe, never degraded (they already are); so is
    ``skip (B, F, C, h, w)``, the second skip source of a model with ``skip_source`` (raw
    latents; a previous frame is the generator's own, as in a stream; else None);
    ``pose (B, F, 2)`` the rig's pose for a model with ``pose_path``."""
    b, f = actions.shape
    nc = f // chunk_frames
    if nc < 2:
        raise ValueError("on-policy clips need at least two chunks (context + target)")
    z = model.normalize(lat.to(device))
    zg = model.normalize(own_lat.to(device))
    zb_own = model.normalize(base_own.to(device))
    zb_orig = model.normalize(base_orig.to(device))
    k = torch.randint(1, nc, (b,), generator=gen)
    is_ctx = torch.arange(nc)[None] < k[:, None]
    sig = torch.where(
        is_ctx,
        torch.rand(b, nc, generator=gen) * ctx_sigma_max,
        torch.sigmoid(torch.randn(b, nc, generator=gen)),
    )
    sig = sig.repeat_interleave(chunk_frames, dim=1).to(device)
    ctx_frames = is_ctx.repeat_interleave(chunk_frames, dim=1).to(device)[..., None, None, None]
    clean = torch.where(ctx_frames, zg, z)
    base_sig = (torch.rand(b, f, generator=gen) * ctx_sigma_max).to(device)
    bs = base_sig[..., None, None, None]
    zb = (1 - bs) * zb_own + bs * torch.randn(zb_own.shape, generator=gen).to(device)
    txt = txt.to(device) * (torch.rand(b, 1, 1, generator=gen) >= 0.1).to(device)
    offset = torch.randint(0, 1000, (b, 1), generator=gen)
    pos = (offset + torch.arange(f)[None]).to(device)
    s = sig[..., None, None, None]
    noise = training_noise(z.shape, gen, model.config.noise_correlation, model.config.noise_scale)
    x = (1 - s) * clean + s * noise.to(device)
    known = known.to(device)
    zs = noised_skip(model, skip, gen, base_sig, 0.0, device)
    with autocast(device):
        pred = model(x, zb, base_sig, known, sig, actions.to(device), txt, pos, ctx, skip=zs,
                     pose=None if pose is None else pose.to(device))
    target = onpolicy_target(z, zb_own, zb_orig, known)
    weight = 1.0 + new_weight * (1.0 - known[:, :, :1])
    if change_weight:
        weight = weight + change_weight * change_map(target, zb_own)
    weight = weight * (~ctx_frames).float()
    return torch.sum(weight * (pred.float() - target) ** 2) / torch.sum(
        weight.expand_as(pred)
    ).clamp_min(1.0)


@dataclass
class OnPolicyPool:
    """On-policy data for a subset of the dataset's episodes: ``index (N,)`` int64 rows of the
    :class:`LatentDataset`, ``base (N, L, C, h, w)`` float16 raw latents of the bases replayed
    from the generator's frames, ``latents (N, L, C, h, w)`` float16 raw latents the generator
    produced; ``round`` which refresh made it; ``camera_rms`` px, the model's own camera path
    against the forced one (the check)."""

    index: torch.Tensor
    base: torch.Tensor
    latents: torch.Tensor
    round: int
    camera_rms: float

    def sample(self, data: LatentDataset, rng: np.random.Generator, batch: int, frames: int,
               chunk_frames: int = 1, skip_source: str | None = None):
        """Random on-policy clips: ``lat, own_lat, base_orig, base_own (B, F, C, h, w)``
        float32 raw latents, ``known (B, F, 2, h, w)`` float32 in [0, 1], ``actions (B, F)``,
        ``txt (B, F, 384)``, ``skip (B, F, C, h, w)``: the second skip source (``"previous"``:
        the generator's own frame before each frame's chunk; ``"warped"``: ``data.skip``;
        None: None) and ``pose (B, F, 2)`` the rig's pose
        (None unless the data has poses)."""
        before = chunk_frames if skip_source == "previous" else 0
        n, length = self.base.shape[:2]
        j = torch.as_tensor(rng.integers(0, n, batch))
        s = torch.as_tensor(rng.integers(0, length - frames - before + 1, batch))
        idx = s[:, None] + torch.arange(frames + before)[None]
        rows, erows = j[:, None], self.index[j][:, None]
        own = self.latents[rows, idx].float()
        skip = previous_frames(own, chunk_frames) if skip_source == "previous" else None
        idx = idx[:, before:]
        return (
            data.latents[erows, idx].float(),
            own[:, before:],
            data.base[erows, idx].float(),
            self.base[rows, idx].float(),
            data.known[erows, idx].float() / 255.0,
            data.actions[erows, idx],
            data.prompt_emb[data.prompt[erows, idx]],
            data.skip[erows, idx].float() if skip_source == "warped" else skip,
            data.pose[erows, idx] if data.pose is not None else None,
        )


def build_pool(
    model: WorldDiT,
    ae,
    shard_dirs: list[Path],
    index: np.ndarray,
    *,
    round: int,
    batch: int = 16,
    steps: int = 4,
    device: torch.device | None = None,
    prompts: Sequence[str] = PROMPTS,
    settings: dict | None = None,
) -> OnPolicyPool:
    """Roll a copy of ``model`` (eval mode, fp32) out on episodes ``index`` with the world's
    streaming ``settings`` (:class:`BuiltinConfig` keyword arguments; None: its defaults and
    the shipped colour prior, the landscape's) in ``steps`` denoising steps, ``batch``
    episodes at a time (batched forwards: the rollouts need no bit-exact replay), and replay
    their bases; ``prompts`` the table the shards' prompt indices point into."""
    device = device or pick_device()
    gen = BuiltinBackend(
        copy.deepcopy(model).float(),
        copy.deepcopy(ae),
        # one restyle pass per switch: the bases are replayed by memory_bases, which starts
        # one memory epoch per scene switch (as the recorded training data does)
        BuiltinConfig(**{"colour_prior": load_colour_prior(), **(settings or {}),
                         "max_states": batch, "device": device.type,
                         "cpu_threads": None, "batch_invariant": False, "restyle_chunks": 1}),
    )
    ae_enc = ae.to(device).eval()
    chunk = model.config.chunk_frames
    bases, lats, errs = [], [], []
    for a in tqdm(range(0, len(index), batch), desc=f"on-policy round {round}", unit="batch"):
        eps = load_episodes(shard_dirs, index[a : a + batch], chunk)
        rolls = collect_rollouts(gen, eps, steps, seed=round, prompts=prompts)
        base, _ = onpolicy_bases(ae_enc, rolls, eps, chunk, device, model.config,
                                 gen.config.memory_settle_px)
        bases.append(base)
        lats.append(model.denormalize(rolls.latents).half())
        errs.append(rolls.camera_err.reshape(-1, 2))
    rms = float(np.sqrt(np.mean(np.concatenate(errs) ** 2)))
    return OnPolicyPool(
        torch.as_tensor(index, dtype=torch.int64), torch.cat(bases), torch.cat(lats), round, rms
    )


def finetune_onpolicy(
    data: LatentDataset,
    ae,
    shard_dirs: list[Path],
    init_from: Path,
    out_dir: Path,
    run_dir: Path,
    *,
    steps: int,
    refresh_every: int = 0,
    pool_episodes: int = 128,
    p_onpolicy: float = 0.5,
    batch: int = 16,
    frames: int = 8,
    lr: float = 1e-4,
    warmup: int = 50,
    ctx_sigma_max: float = 0.3,
    seed: int = 0,
    ckpt_every: int = 100,
    export_every: int = 200,
    max_minutes: float | None = None,
    rollout_batch: int = 16,
    rollout_steps: int = 4,
    prompts: Sequence[str] = PROMPTS,
    settings: dict | None = None,
    change_weight: float = 0.0,
) -> dict:
    """Fine-tune a trained :class:`WorldDiT` (``init_from``) with on-policy rows; resumable
    from ``run_dir/onpolicy_checkpoint.pt`` (the pool in ``run_dir/onpolicy_pool.pt``).

    Each step: ``round(p_onpolicy * batch)`` rows of on-policy clips (:func:`onpolicy_loss`)
    and the rest of the original recipe (:func:`world_loss`, degraded bases included), the two
    losses weighted by their row counts. The pool holds ``pool_episodes`` random training
    episodes rolled out by the current EMA weights (the ones exported); it is rebuilt every
    ``refresh_every`` steps (0: built once, from ``init_from``), in ``rollout_steps`` denoising
    steps with the world's streaming ``settings`` and ``prompts`` (:func:`build_pool`); both
    losses add ``change_weight`` times the change map (the world's recipe). The camera
    dynamics stay frozen. EMA weights exported to ``out_dir`` with ``save_pretrained``."""
    device = pick_device()
    seed_everything(seed)
    model = WorldDiT.from_pretrained(init_from).to(device)
    if model.config.pose_path is not None:
        attach_poses(data, make_base_warp(model.config.pose_path, model.config.image_size))
    ckpt_path, pool_path = run_dir / "onpolicy_checkpoint.pt", run_dir / "onpolicy_pool.pt"
    params, ema, opt, sched, step, wall = resume_run(model, lr, warmup, ckpt_path, device)
    rng = np.random.default_rng([seed, step, 17])
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step + 17)
    chunk = model.config.chunk_frames
    ctx = DenseContext(
        expand_frame_mask(block_causal_frame_mask(frames, chunk), model.tokens_per_frame).to(device)
    )
    t0 = time.perf_counter()
    log = (run_dir / "onpolicy_log.jsonl").open("a")

    def ema_model() -> WorldDiT:
        m = copy.deepcopy(model)
        ema.copy_to([p for p in m.parameters() if p.requires_grad])
        return m.eval()

    def new_pool(rnd: int) -> OnPolicyPool:
        pick = np.random.default_rng([seed, rnd, 29]).choice(
            data.latents.shape[0], size=min(pool_episodes, data.latents.shape[0]), replace=False
        )
        t = time.perf_counter()
        pool = build_pool(
            ema_model(),
            ae,
            shard_dirs,
            np.sort(pick),
            round=rnd,
            batch=rollout_batch,
            steps=rollout_steps,
            device=device,
            prompts=prompts,
            settings=settings,
        )
        torch.save(pool.__dict__, pool_path)
        rec = {
            "event": "pool",
            "round": rnd,
            "step": step,
            "episodes": len(pick),
            "camera_rms_px": round(pool.camera_rms, 3),
            "s": round(time.perf_counter() - t, 1),
        }
        log.write(json.dumps(rec) + "\n")
        log.flush()
        tqdm.write(json.dumps(rec))
        return pool

    def round_of(s: int) -> int:
        return s // refresh_every if refresh_every else 0

    if pool_path.exists() and (saved := OnPolicyPool(**torch.load(pool_path))).round == round_of(
        step
    ):
        pool = saved
    else:
        pool = new_pool(round_of(step))

    def checkpoint() -> None:
        save_run(ckpt_path, model, ema, opt, sched, step, wall + time.perf_counter() - t0)

    def export() -> None:
        export_ema(model, ema, params, out_dir)

    n_own = int(round(p_onpolicy * batch))
    losses: list[tuple[float, float]] = []
    bar = tqdm(total=steps, initial=step, desc="finetune-onpolicy", unit="step")
    while step < steps:
        if max_minutes is not None and time.perf_counter() - t0 > 60 * max_minutes:
            break
        if round_of(step) != pool.round:
            checkpoint()
            pool = new_pool(round_of(step))
        model.train()
        total, parts = 0.0, [float("nan"), float("nan")]
        if batch - n_own > 0:
            lat, base, known, actions, txt, skip, pose = recipe_clips(
                data, rng, batch - n_own, frames, chunk, model.config.skip_source)
            lo = world_loss(
                model, lat, base, known, actions, txt, gen, chunk, ctx_sigma_max, ctx, device,
                change_weight=change_weight, skip=skip, pose=pose,
            )
            total = total + lo * (batch - n_own) / batch
            parts[0] = lo.item()
        if n_own > 0:
            *clips, skip, pose = pool.sample(data, rng, n_own, frames, chunk,
                                             model.config.skip_source)
            lo = onpolicy_loss(
                model,
                *clips,
                gen,
                chunk,
                ctx_sigma_max,
                ctx,
                device,
                change_weight=change_weight,
                skip=skip,
                pose=pose,
            )
            total = total + lo * n_own / batch
            parts[1] = lo.item()
        opt.zero_grad(set_to_none=True)
        total.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        ema.step(params)
        step += 1
        losses.append((parts[0], parts[1]))
        bar.update(1)
        recent = np.nanmean(np.array(losses[-50:]), axis=0)
        bar.set_postfix(orig=f"{recent[0]:.4f}", own=f"{recent[1]:.4f}")
        if step % ckpt_every == 0:
            checkpoint()
            avg = np.nanmean(np.array(losses[-ckpt_every:]), axis=0)
            rec = {
                "event": "step",
                "step": step,
                "loss_orig": round(float(avg[0]), 5),
                "loss_own": round(float(avg[1]), 5),
                "wall_s": round(wall + time.perf_counter() - t0, 1),
            }
            log.write(json.dumps(rec) + "\n")
            log.flush()
        if step % export_every == 0:
            export()
    bar.close()
    checkpoint()
    export()
    log.close()
    result = {
        "steps": step,
        "wall_s": round(wall + time.perf_counter() - t0, 1),
        "pool_round": pool.round,
        "camera_rms_px": round(pool.camera_rms, 3),
    }
    (run_dir / "onpolicy_result.json").write_text(json.dumps(result))
    return result
