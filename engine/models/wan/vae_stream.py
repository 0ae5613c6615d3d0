"""Streaming decode of Wan VAE latents, chunk by chunk, keeping the causal feature cache.

``AutoencoderKLWan.decode`` decodes latent frames one at a time through causal 3-D convolutions
whose last input frames it keeps in a feature cache; it clears that cache at the start and end
of every call, so decoding a stream chunk by chunk would restart the causal context each time
(a visible seam, and the first frame of every chunk decoded as a video start). Here each
session keeps its own :class:`WanDecodeCache` across chunks and only the new latent frames are
decoded. The cache entries are replaced, never modified in place, by the decoder, so a shallow
copy of the list is an independent snapshot (fork, rewind).

The first latent frame of a stream decodes to one video frame, every later one to
``temporal_compression_ratio`` (4) frames.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from diffusers import AutoencoderKLWan


@dataclass
class WanDecodeCache:
    """One stream's decoder feature cache: ``entries[i]`` is the last input frames of causal
    conv ``i`` (a tensor ``(1, C, <=2, h, w)``), ``"Rep"`` or None before the first frame."""

    entries: list = field(default_factory=list)
    started: bool = False

    def snapshot(self) -> WanDecodeCache:
        return WanDecodeCache(list(self.entries), self.started)


def new_decode_cache(vae: AutoencoderKLWan) -> WanDecodeCache:
    """An empty cache for a new stream of ``vae``."""
    return WanDecodeCache([None] * vae._cached_conv_counts["decoder"], False)


def denormalize_latents(vae: AutoencoderKLWan, latents: torch.Tensor) -> torch.Tensor:
    """Model-space latents ``(B, C, F, h, w)`` -> VAE latents (``x * std + mean`` per channel,
    the inverse of the normalization the Wan transformer was trained on)."""
    shape = (1, vae.config.z_dim, 1, 1, 1)
    mean = torch.tensor(vae.config.latents_mean, device=latents.device).view(shape)
    std = torch.tensor(vae.config.latents_std, device=latents.device).view(shape)
    return latents * std.to(latents.dtype) + mean.to(latents.dtype)


def _stack(entries_per_row: list[list]) -> list:
    stacked = []
    for column in zip(*entries_per_row, strict=True):
        first = column[0]
        if isinstance(first, torch.Tensor) and len(column) > 1:
            first = torch.cat(column, dim=0)
        stacked.append(first)
    return stacked


@torch.no_grad()
def decode_stream(vae: AutoencoderKLWan, latents: torch.Tensor,
                  caches: list[WanDecodeCache]) -> torch.Tensor:
    """Decode the next latent frames of ``B`` streams, updating their caches in place.

    Args:
        vae: the Wan VAE (its ``decoder`` and ``post_quant_conv``; tiling is not used).
        latents: ``(B, z_dim, F, h, w)`` VAE-space latents (see :func:`denormalize_latents`),
            the frames that follow whatever each cache has already decoded.
        caches: one per batch row; all must be at the same phase (all new or all started),
            since the first frame of a stream is decoded differently.
    Returns:
        ``(B, 3, T, 8h, 8w)`` in [-1, 1], ``T = 1 + 4(F-1)`` for new streams, ``4F`` otherwise.
    Raises:
        ValueError: a cache count that differs from the batch, or mixed phases.
    """
    if len(caches) != latents.shape[0]:
        raise ValueError(f"{len(caches)} caches for a batch of {latents.shape[0]}")
    started = {c.started for c in caches}
    if len(started) != 1:
        raise ValueError("decode new and started streams in separate calls")
    first = not started.pop()
    feat = [None] * len(caches[0].entries) if first else _stack([c.entries for c in caches])
    x = vae.post_quant_conv(latents)
    outs = []
    for i in range(x.shape[2]):
        outs.append(vae.decoder(x[:, :, i:i + 1], feat_cache=feat, feat_idx=[0],
                                first_chunk=first and i == 0))
    for row, cache in enumerate(caches):
        cache.entries = [e[row:row + 1] if isinstance(e, torch.Tensor) else e for e in feat]
        cache.started = True
    return torch.cat(outs, dim=2).clamp(-1.0, 1.0)
