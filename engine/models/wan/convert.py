"""Causal Wan checkpoints (Self-Forcing, CausVid, LongLive base) in the original Wan key naming
<-> diffusers' ``WanTransformer3DModel`` names.

The original Wan2.1 ``WanModel`` (and the causal ``CausalWanModel`` those projects train) names
its parameters ``blocks.N.self_attn.q.weight``, ``blocks.N.modulation``, ``head.head.weight``
...; diffusers renames them (source of the correspondence: diffusers'
``scripts/convert_wan_to_diffusers.py``, ``TRANSFORMER_KEYS_RENAME_DICT``; the table below is
derived from it for the text-to-video model only). One subtlety: the original calls its norms
in the order norm1 (self-attn), norm3 (cross-attn), norm2 (ffn); only the cross-attention norm
has weights, so original ``norm3`` is diffusers ``norm2``.

Training checkpoints store the generator under a key (``generator_ema``, ``generator``, ``model``
or ``state_dict``) and its parameters with a ``model.`` / ``generator.`` prefix (and may carry
``_fsdp_wrapped_module.`` / ``_orig_mod.`` from FSDP or torch.compile anywhere in a name); all
of these are removed here.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path

import torch

#: original block component -> diffusers block component (inside ``blocks.N.``)
_BLOCK_RENAMES: dict[str, str] = {
    "self_attn.q": "attn1.to_q",
    "self_attn.k": "attn1.to_k",
    "self_attn.v": "attn1.to_v",
    "self_attn.o": "attn1.to_out.0",
    "self_attn.norm_q": "attn1.norm_q",
    "self_attn.norm_k": "attn1.norm_k",
    "cross_attn.q": "attn2.to_q",
    "cross_attn.k": "attn2.to_k",
    "cross_attn.v": "attn2.to_v",
    "cross_attn.o": "attn2.to_out.0",
    "cross_attn.norm_q": "attn2.norm_q",
    "cross_attn.norm_k": "attn2.norm_k",
    "norm3": "norm2",
    "ffn.0": "ffn.net.0.proj",
    "ffn.2": "ffn.net.2",
}
#: original top-level module -> diffusers module
_TOP_RENAMES: dict[str, str] = {
    "patch_embedding": "patch_embedding",
    "text_embedding.0": "condition_embedder.text_embedder.linear_1",
    "text_embedding.2": "condition_embedder.text_embedder.linear_2",
    "time_embedding.0": "condition_embedder.time_embedder.linear_1",
    "time_embedding.2": "condition_embedder.time_embedder.linear_2",
    "time_projection.1": "condition_embedder.time_proj",
    "head.head": "proj_out",
}
#: whole-name parameters (no .weight/.bias suffix)
_PARAM_RENAMES: dict[str, str] = {"head.modulation": "scale_shift_table"}
_BLOCK_PARAM_RENAMES: dict[str, str] = {"modulation": "scale_shift_table"}

_PREFIXES = ("module.", "generator.", "model.")
#: wrapper names FSDP, activation checkpointing and torch.compile insert anywhere in a name
_WRAPPERS = ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_orig_mod.")
#: where training checkpoints keep the generator's weights, in order of preference
#: (Self-Forcing's README runs inference with ``--use_ema``)
_CONTAINER_KEYS = ("generator_ema", "generator", "model", "state_dict")
_BLOCK_RE = re.compile(r"^blocks\.(\d+)\.(.+)$")
_SUFFIX_RE = re.compile(r"^(.+)\.(weight|bias)$")


class KeyConversionError(ValueError):
    """Checkpoint keys that have no counterpart; ``unmatched`` lists them (sorted)."""

    def __init__(self, message: str, unmatched: Iterable[str]):
        self.unmatched = sorted(unmatched)
        shown = ", ".join(self.unmatched[:20])
        more = f" (+{len(self.unmatched) - 20} more)" if len(self.unmatched) > 20 else ""
        super().__init__(f"{message}: {shown}{more}")


def _strip_prefixes(key: str) -> str:
    for wrapper in _WRAPPERS:
        key = key.replace(wrapper, "")
    changed = True
    while changed:
        changed = False
        for prefix in _PREFIXES:
            if key.startswith(prefix):
                key, changed = key[len(prefix):], True
    return key


def _rename(key: str, block: Mapping[str, str], top: Mapping[str, str],
            params: Mapping[str, str], block_params: Mapping[str, str]) -> str | None:
    if key in params:
        return params[key]
    m = _BLOCK_RE.match(key)
    if m:
        index, rest = m.groups()
        if rest in block_params:
            return f"blocks.{index}.{block_params[rest]}"
        s = _SUFFIX_RE.match(rest)
        if s and s.group(1) in block:
            return f"blocks.{index}.{block[s.group(1)]}.{s.group(2)}"
        return None
    s = _SUFFIX_RE.match(key)
    if s and s.group(1) in top:
        return f"{top[s.group(1)]}.{s.group(2)}"
    return None


def _invert(table: Mapping[str, str]) -> dict[str, str]:
    return {v: k for k, v in table.items()}


def original_to_diffusers(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Rename an original-naming Wan state dict (prefixes allowed) to diffusers names.

    Raises KeyConversionError listing every key that matches no known original name (e.g. an
    image-to-video or LoRA checkpoint), and ValueError when two keys map to one name.
    """
    out: dict[str, torch.Tensor] = {}
    unmatched = []
    for key, value in state_dict.items():
        name = _rename(_strip_prefixes(key), _BLOCK_RENAMES, _TOP_RENAMES, _PARAM_RENAMES,
                       _BLOCK_PARAM_RENAMES)
        if name is None:
            unmatched.append(key)
        elif name in out:
            raise ValueError(f"checkpoint key {key!r} maps to {name!r}, which another key "
                             "already gave (two copies of the weights under different prefixes?)")
        else:
            out[name] = value
    if unmatched:
        raise KeyConversionError("checkpoint keys with no Wan text-to-video counterpart",
                                 unmatched)
    return out


def diffusers_to_original(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The inverse of :func:`original_to_diffusers` (no prefix added). Raises
    KeyConversionError listing diffusers keys with no original name."""
    out: dict[str, torch.Tensor] = {}
    unmatched = []
    for key, value in state_dict.items():
        name = _rename(key, _invert(_BLOCK_RENAMES), _invert(_TOP_RENAMES),
                       _invert(_PARAM_RENAMES), _invert(_BLOCK_PARAM_RENAMES))
        if name is None:
            unmatched.append(key)
        else:
            out[name] = value
    if unmatched:
        raise KeyConversionError("diffusers keys with no original Wan counterpart", unmatched)
    return out


def check_against_model(converted: Mapping[str, torch.Tensor], model: torch.nn.Module) -> None:
    """Raise KeyConversionError unless ``converted`` has exactly the model's parameter names
    (missing and unexpected keys are both listed) and ValueError on the first shape mismatch
    (a checkpoint of another model size)."""
    expected = model.state_dict()
    missing = set(expected) - set(converted)
    extra = set(converted) - set(expected)
    if missing or extra:
        raise KeyConversionError(
            f"checkpoint does not match the transformer ({len(missing)} missing, "
            f"{len(extra)} unexpected)", [f"missing {k}" for k in missing]
            + [f"unexpected {k}" for k in extra])
    for key, value in converted.items():
        if tuple(value.shape) != tuple(expected[key].shape):
            raise ValueError(f"checkpoint {key}: shape {tuple(value.shape)} but the transformer "
                             f"expects {tuple(expected[key].shape)} (another model size?)")


def load_causal_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """Read a causal checkpoint file (``.safetensors``, or ``.pt``/``.pth`` loaded with
    ``weights_only=True``) and return its generator weights in diffusers naming.

    Raises FileNotFoundError for a missing file, ValueError for an unknown extension or a file
    without a tensor dict, KeyConversionError listing unmatched keys.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(2, "causal checkpoint not found", str(path))
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        raw = load_file(str(path))
    elif path.suffix in (".pt", ".pth", ".ckpt"):
        raw = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    else:
        raise ValueError(f"{path}: unknown checkpoint type {path.suffix!r} "
                         "(expected .safetensors, .pt, .pth or .ckpt)")
    if not isinstance(raw, Mapping):
        raise ValueError(f"{path}: expected a dict of tensors, got {type(raw).__name__}")
    for key in _CONTAINER_KEYS:
        if isinstance(raw.get(key), Mapping):
            raw = raw[key]
            break
    tensors = {k: v for k, v in raw.items() if isinstance(v, torch.Tensor)}
    if not tensors:
        raise ValueError(f"{path}: no tensors found (top-level keys: {sorted(raw)[:10]})")
    return original_to_diffusers(tensors)
