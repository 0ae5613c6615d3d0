"""The Wan2.1 VAE as published (``Wan2.1_VAE.pth``, the original Wan naming) -> diffusers'
``AutoencoderKLWan`` names.

The original keeps the encoder's and decoder's blocks in flat sequences (``downsamples.N``,
``upsamples.N``: residual blocks as ``residual.{0,2,3,6}`` = norm, conv, norm, conv, plus a
``shortcut``; resamplers with ``resample.1`` and ``time_conv``), a ``middle`` of
(resnet, attention, resnet), a ``head`` of (norm, -, conv), and ``conv1``/``conv2`` around the
latent. diffusers keeps the encoder's flat list (``down_blocks.N``) and groups the decoder's in
fours (three resnets, then the upsampler: ``up_blocks.{N // 4}``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import torch

from worldstream.engine.models.wan.convert import KeyConversionError

_RESIDUAL = {"residual.0.gamma": "norm1.gamma", "residual.2": "conv1", "residual.3.gamma":
             "norm2.gamma", "residual.6": "conv2", "shortcut": "conv_shortcut"}
_TOP = {"conv1": "quant_conv", "conv2": "post_quant_conv"}
_PART = re.compile(r"^(encoder|decoder)\.(.+)$")


def _residual(rest: str) -> str | None:
    for old, new in _RESIDUAL.items():
        if rest == old or rest.startswith(old + "."):
            return new + rest[len(old):]
    return None


def _block(part: str, rest: str) -> str | None:
    """A key inside ``encoder.``/``decoder.`` (``rest``), renamed, or None."""
    head, _, tail = rest.partition(".")
    if head == "conv1":
        return f"conv_in.{tail}"
    if head == "head":
        index, _, leaf = tail.partition(".")
        return {"0": f"norm_out.{leaf}", "2": f"conv_out.{leaf}"}.get(index)
    if head == "middle":
        index, _, leaf = tail.partition(".")
        if index == "1":
            return f"mid_block.attentions.0.{leaf}"
        inner = _residual(leaf)
        return None if inner is None or index not in ("0", "2") else \
            f"mid_block.resnets.{int(index) // 2}.{inner}"
    sequence = {"encoder": "downsamples", "decoder": "upsamples"}[part]
    if head != sequence:
        return None
    index, _, leaf = tail.partition(".")
    if not index.isdigit():
        return None
    n = int(index)
    inner = _residual(leaf)
    if leaf.startswith(("resample.", "time_conv.")):
        inner = leaf
    if inner is None:
        return None
    if part == "encoder":
        return f"down_blocks.{n}.{inner}"
    if n % 4 == 3:  # the decoder's fourth entry of each group is its upsampler
        return f"up_blocks.{n // 4}.upsamplers.0.{inner}"
    return f"up_blocks.{n // 4}.resnets.{n % 4}.{inner}"


def original_vae_to_diffusers(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Rename a ``Wan2.1_VAE.pth`` state dict. KeyConversionError listing every key that
    matches no rule."""
    out, unmatched = {}, []
    for key, value in state.items():
        name = None
        stem, _, leaf = key.partition(".")
        if stem in _TOP:
            name = f"{_TOP[stem]}.{leaf}"
        else:
            m = _PART.match(key)
            if m:
                inner = _block(m.group(1), m.group(2))
                name = None if inner is None else f"{m.group(1)}.{inner}"
        if name is None:
            unmatched.append(key)
        else:
            out[name] = value
    if unmatched:
        raise KeyConversionError("VAE keys with no AutoencoderKLWan counterpart", unmatched)
    return out
