"""The world model's training recipe: one forward of the flow-matching x0 loss over a clip.

Flow matching on normalised autoencoder latents, x_σ = (1 - σ)·x0 + σ·ε, the network predicting
x0 on top of each frame's spatial-memory base (the bases replayed from the recorded episodes
exactly as the engine reads them, ``engine.training.latents.memory_bases``). An independent
noise level per chunk (Diffusion Forcing), drawn logit-normal (SD3); most rows are
inference-like: the chunks before a random chunk k are noise-augmented context at a small level
σ ~ U[0, ctx_sigma_max] (GameNGen/DIAMOND context noise), and every base is noised the same way.
Text embeddings are dropped 10 % of the time.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from worldstream.engine.models.builtin.attention import DenseContext
from worldstream.engine.models.builtin.world_dit import WorldDiT
from worldstream.engine.training.common import autocast
from worldstream.engine.training.latents import LatentDataset


def sample_chunk_sigmas(
    gen: torch.Generator, batch: int, num_chunks: int, ctx_sigma_max: float,
    p_context: float = 0.5,
) -> torch.Tensor:
    """``(B, num_chunks)`` noise levels: logit-normal per chunk; in a fraction ``p_context``
    of the rows the chunks before a random chunk k >= 1 are context at U[0, ctx_sigma_max].

    NOTE: motion is only learnable where the context is clean enough to read the camera's
    velocity from; with half the rows pure Diffusion Forcing the model settled on copying the
    last frame, so the recipe uses p_context = 0.9."""
    sig = torch.sigmoid(torch.randn(batch, num_chunks, generator=gen))
    inference_like = torch.rand(batch, generator=gen) < p_context
    k = torch.randint(1, max(num_chunks, 2), (batch,), generator=gen)
    before_k = torch.arange(num_chunks)[None] < k[:, None]
    ctx = torch.rand(batch, num_chunks, generator=gen) * ctx_sigma_max
    return torch.where(inference_like[:, None] & before_k, ctx, sig)


def degrade_bases(zb: torch.Tensor, gen: torch.Generator, p: float) -> torch.Tensor:
    """In a fraction ``p`` of the frames, blur the base latents ``(B, F, C, h, w)`` (3 × 3 box)
    and shift each channel by N(0, 0.3²) (normalised units: a colour cast).

    NOTE: in training, memory holds the autoencoder's reconstructions of real frames; in a
    free rollout it holds the model's own output, blurrier and drifting in colour, and new
    ground is generated next to it. Trained on clean memory only, step-1,000 weights copied
    that drift into every new strip until a snowy world had turned green by frame 70: the
    model must learn that memory can be off and that the prompt says what the world looks
    like (exposure bias, as context noise handles it for the temporal context)."""
    b, f, c, h, w = zb.shape
    hit = (torch.rand(b, f, 1, 1, 1, generator=gen) < p).to(zb.device)
    blurred = F.avg_pool2d(zb.reshape(b * f, c, h, w), 3, 1, 1, count_include_pad=False)
    cast = 0.3 * torch.randn(b, f, c, 1, 1, generator=gen).to(zb.device)
    return torch.where(hit, blurred.reshape(zb.shape) + cast, zb)


def recipe_clips(data: LatentDataset, rng: np.random.Generator, batch: int, frames: int,
                 chunk_frames: int, skip_source: str | None) -> tuple:
    """A batch of the recipe's clips: ``(lat, base, known, actions, txt, skip, pose)``, the
    first five as :meth:`LatentDataset.sample` gives them, ``skip (B, F, C, h, w)`` raw
    latents of each frame's memory picture warped to its pose (``skip_source`` ``"warped"``:
    ``data.skip``; None: None) and ``pose (B, F, 2)`` the rig's pose at each frame (None
    unless the data has poses: :func:`~engine.training.latents.attach_poses`). ValueError for
    a ``"warped"`` source the data lacks."""
    if skip_source == "warped" and data.skip is None:
        raise ValueError("the data has no warped memory pictures (data.skip)")
    rows, idx = data.clip_index(rng, batch, frames)
    lat, base, known, actions, txt, _ = data.clips(rows, idx)
    skip = data.skip[rows, idx].float() if skip_source == "warped" else None
    pose = data.pose[rows, idx] if data.pose is not None else None
    return lat, base, known, actions, txt, skip, pose


def noised_skip(model: WorldDiT, skip: torch.Tensor | None, gen: torch.Generator,
                base_sig: torch.Tensor, device: torch.device):
    """The second skip source as trained: raw latents ``skip (B, F, C, h, w)`` normalised and
    noised at each frame's base level ``base_sig (B, F)`` (context noise; the engine feeds both
    at ``ctx_sigma``); None passes through."""
    if skip is None:
        return None
    # NOTE: a degradation at rate 0 changes nothing but draws from ``gen``, as the shipped
    # warped-skip runs did: their random stream stays the same
    zs = degrade_bases(model.normalize(skip.to(device)), gen, 0.0)
    ss = base_sig[..., None, None, None]
    return (1 - ss) * zs + ss * torch.randn(zs.shape, generator=gen).to(device)


@dataclass
class WorldPrediction:
    """One training forward of :func:`world_prediction`, model space: ``pred``/``target``
    ``(B, F, C, h, w)`` the predicted and the true clean latents, ``weight`` ``(B, F, 1, h, w)``
    the squared error's weight, ``sigma (B, F)`` each frame's noise level, ``known (B, F, 2, h,
    w)``, ``txt (B, F, 384)`` the text as fed (dropped rows zero)."""

    pred: torch.Tensor
    target: torch.Tensor
    weight: torch.Tensor
    sigma: torch.Tensor
    known: torch.Tensor
    txt: torch.Tensor

    def loss(self) -> torch.Tensor:
        """The weighted squared error, a scalar."""
        err = (self.pred - self.target) ** 2
        return torch.sum(self.weight * err) / torch.sum(self.weight.expand_as(self.pred))


def world_loss(*args, **kwargs) -> torch.Tensor:
    """:func:`world_prediction`'s weighted squared error (same arguments)."""
    return world_prediction(*args, **kwargs).loss()


def world_prediction(
    model: WorldDiT,
    lat: torch.Tensor,
    base: torch.Tensor,
    known: torch.Tensor,
    actions: torch.Tensor,
    txt: torch.Tensor,
    gen: torch.Generator,
    chunk_frames: int,
    ctx_sigma_max: float,
    ctx: DenseContext,
    device: torch.device,
    p_context: float = 0.9,
    new_weight: float = 4.0,
    p_degrade: float = 0.3,
    change_weight: float = 0.0,
    skip: torch.Tensor | None = None,
    pose: torch.Tensor | None = None,
) -> WorldPrediction:
    """The forward of the flow-matching x0 loss over a clip: ``lat``/``base (B, F, C, h, w)``
    autoencoder latents of the frames and of their memory bases, ``known (B, F, 2, h, w)``,
    ``actions (B, F)``, ``txt (B, F, 384)``. Squared error weighted ``1 + new_weight`` where
    memory held nothing of the current prompt (what the model must generate), 1 where it only
    copies, plus ``change_weight`` times :func:`change_map` (where the frame differs from its
    base). A fraction ``p_degrade`` of the bases is degraded first (:func:`degrade_bases`).
    ``skip (B, F, C, h, w)``: raw latents of each frame's second skip source for a model with
    ``skip_source`` (:func:`recipe_clips`, fed as :func:`noised_skip`); ``pose (B, F, 2)``:
    the rig's pose for a model with ``pose_path``."""
    b, f = actions.shape
    nc = f // chunk_frames
    z = model.normalize(lat.to(device))
    zb = model.normalize(base.to(device))
    change = change_map(z, zb) if change_weight else None
    sig = sample_chunk_sigmas(gen, b, nc, ctx_sigma_max, p_context)
    sig = sig.repeat_interleave(chunk_frames, dim=1).to(device)
    zb = degrade_bases(zb, gen, p_degrade)
    pred, known, txt = noised_forward(model, z, zb, sig, known, actions, txt, gen, ctx_sigma_max,
                                      ctx, device, skip, pose)
    # NOTE: most of a frame is remembered ground the model only has to copy; without weighting,
    # the few percent it must generate (new ground at the border, the sprite, restyled ground)
    # were a few percent of the loss, and at step 500 new ground came out in no scene's colours
    weight = 1.0 + new_weight * (1.0 - known[:, :, :1])
    if change is not None:
        weight = weight + change_weight * change
    return WorldPrediction(pred, z, weight, sig, known, txt)


def noised_forward(
    model: WorldDiT,
    clean: torch.Tensor,
    zb: torch.Tensor,
    sig: torch.Tensor,
    known: torch.Tensor,
    actions: torch.Tensor,
    txt: torch.Tensor,
    gen: torch.Generator,
    ctx_sigma_max: float,
    ctx: DenseContext,
    device: torch.device,
    skip: torch.Tensor | None,
    pose: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The model's x0 prediction for normalised latents ``clean (B, F, C, h, w)`` noised at the
    per-frame levels ``sig (B, F)`` (white noise), on top of the normalised bases ``zb`` noised
    at U[0, ctx_sigma_max], the text dropped 10 % of the time, positions from a random offset
    and the noised second skip source (:func:`noised_skip`). Returns ``pred``, ``known`` and
    ``txt`` (on ``device``, the text as dropped). The one forward of :func:`world_prediction`
    and :func:`~engine.training.onpolicy.onpolicy_loss` (same draws from ``gen``, same order)."""
    b, f = actions.shape
    base_sig = (torch.rand(b, f, generator=gen) * ctx_sigma_max).to(device)
    bs = base_sig[..., None, None, None]
    zb = (1 - bs) * zb + bs * torch.randn(zb.shape, generator=gen).to(device)
    txt = txt.to(device) * (torch.rand(b, 1, 1, generator=gen) >= 0.1).to(device)
    offset = torch.randint(0, 1000, (b, 1), generator=gen)
    pos = (offset + torch.arange(f)[None]).to(device)
    s = sig[..., None, None, None]
    noise = torch.randn(clean.shape, generator=gen)
    x = (1 - s) * clean + s * noise.to(device)
    known = known.to(device)
    zs = noised_skip(model, skip, gen, base_sig, device)
    with autocast(device):
        pred = model(x, zb, base_sig, known, sig, actions.to(device), txt, pos, ctx, skip=zs,
                     pose=None if pose is None else pose.to(device))
    return pred, known, txt


def change_map(z: torch.Tensor, zb: torch.Tensor, cap: float = 10.0) -> torch.Tensor:
    """``(B, F, 1, h, w)`` how much each latent pixel of the frames ``z`` differs from their
    clean bases ``zb`` (both ``(B, F, C, h, w)``, normalised): the channel-mean absolute
    difference over its batch mean, capped at ``cap``.

    NOTE: where the camera stands still (the avatar world), memory keeps the stream's first
    frame (a pixel is rewritten only by a better view) and a model that copies that base is
    right almost everywhere: the head turn, the expression and the open mouth are a few
    percent of the pixels, and at step 6,000 the model still mostly copied (expression 0.265,
    lip-sync 0.435). Weighting the loss by the change puts the action's effect back in
    proportion (as ``new_weight`` does for new ground): 2,000 steps from those weights gave
    expression 0.51 against 0.36 unweighted (``assets/avatar/MODEL_CARD.md``)."""
    d = (z - zb).abs().mean(dim=2, keepdim=True)
    return (d / d.mean().clamp_min(1e-6)).clamp(max=cap)


