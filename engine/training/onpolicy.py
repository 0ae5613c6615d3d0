"""On-policy fine-tuning data of the built-in world model (Self-Forcing / DAgger style).

The world model is trained with spatial-memory bases replayed from the autoencoder's
reconstructions of *real* frames, but in a stream memory and context hold the model's *own*
output (exposure bias). A pool of the model's own rollouts (``engine.training.rollouts``) gives
rows whose bases and context are what the generator read; :func:`onpolicy_loss` trains on them,
supervised by the simulator's true latents. ``engine.training.train_world`` mixes such rows with
the original recipe (``TrainConfig.p_onpolicy``) and refreshes the pool every
``refresh_every`` steps.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from worldstream.engine.backends.builtin import BuiltinBackend, BuiltinConfig
from worldstream.engine.models.builtin.attention import DenseContext
from worldstream.engine.models.builtin.loading import load_colour_prior
from worldstream.engine.models.builtin.world_dit import WorldDiT
from worldstream.engine.training.common import pick_device
from worldstream.engine.training.latents import LatentDataset
from worldstream.engine.training.recipe import change_map, noised_forward
from worldstream.engine.training.rollouts import collect_rollouts, load_episodes, onpolicy_bases
from worldstream.engine.worlds.recorder import PROMPTS


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
    latents; else None);
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
    pred, known, _ = noised_forward(model, clean, zb_own, sig, known, actions, txt, gen,
                                    ctx_sigma_max, ctx, device, skip, pose)
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
               skip_source: str | None = None):
        """Random on-policy clips: ``lat, own_lat, base_orig, base_own (B, F, C, h, w)``
        float32 raw latents, ``known (B, F, 2, h, w)`` float32 in [0, 1], ``actions (B, F)``,
        ``txt (B, F, 384)``, ``skip (B, F, C, h, w)``: the second skip source (``"warped"``:
        ``data.skip``; None: None) and ``pose (B, F, 2)`` the rig's pose (None unless the data
        has poses)."""
        n, length = self.base.shape[:2]
        j = torch.as_tensor(rng.integers(0, n, batch))
        s = torch.as_tensor(rng.integers(0, length - frames + 1, batch))
        idx = s[:, None] + torch.arange(frames)[None]
        rows, erows = j[:, None], self.index[j][:, None]
        return (
            data.latents[erows, idx].float(),
            self.latents[rows, idx].float(),
            data.base[erows, idx].float(),
            self.base[rows, idx].float(),
            data.known[erows, idx].float() / 255.0,
            data.actions[erows, idx],
            data.prompt_emb[data.prompt[erows, idx]],
            data.skip[erows, idx].float() if skip_source == "warped" else None,
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
