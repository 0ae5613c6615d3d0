"""Loading Matrix-Game 2.0 from the published layout (local folders only), as the
``Skywork/Matrix-Game-2.0`` release is laid out::

    DIR/base_distilled_model/*.safetensors        universal  (one file)
    DIR/gta_distilled_model/*.safetensors         gta_drive
    DIR/templerun_distilled_model/*.safetensors   templerun
    DIR/Wan2.1_VAE.pth                            the Wan2.1 VAE (original naming)
    DIR/models_clip_open-clip-xlm-roberta-large-vit-huge-14.pth   the CLIP (visual tower used)

A variant's checkpoint stores the generator with a ``model.`` prefix, the original Wan key names
(``blocks.N.self_attn.q``, ``img_emb.proj.N``, ``head.head``, ...) and ``blocks.N.action_model.*``
in the blocks the config lists. :func:`convert_checkpoint` renames it to the model of
:func:`~engine.models.matrix_game.transformer.build_transformer`, which is built on the meta
device and filled by assignment, so nothing full-size is allocated twice.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from worldstream.engine.models.matrix_game.config import MatrixGameConfig, Variant
from worldstream.engine.models.matrix_game.transformer import build_transformer
from worldstream.engine.models.wan.convert import (
    KeyConversionError,
    _strip_prefixes,
    check_against_model,
    original_to_diffusers,
)

VAE_FILE = "Wan2.1_VAE.pth"
CLIP_FILE = "models_clip_open-clip-xlm-roberta-large-vit-huge-14.pth"
#: the image projection (``img_emb.proj``: norm, linear, GELU, linear, norm) -> diffusers'
_IMAGE_EMBEDDING = {"0": "norm1", "1": "ff.net.0.proj", "3": "ff.net.2", "4": "norm2"}


@dataclass(frozen=True)
class Layout:
    """The files of one variant in a published folder."""

    checkpoint: Path
    vae: Path
    clip: Path


def check_layout(path: str | Path, variant: Variant) -> Layout:
    """The variant's files in ``path``; FileNotFoundError naming the first missing one (the
    folder, the variant's folder or its ``*.safetensors``, the VAE, the CLIP), ValueError for a
    variant folder with several checkpoints."""
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(2, "Matrix-Game 2.0 folder not found", str(path))
    folder = path / variant.folder
    if not folder.is_dir():
        raise FileNotFoundError(2, f"the {variant.name} model's folder is missing",
                                str(folder))
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(2, f"no checkpoint (*.safetensors) for {variant.name}",
                                str(folder / "*.safetensors"))
    if len(files) > 1:
        raise ValueError(f"{folder} holds {len(files)} checkpoints "
                         f"({', '.join(f.name for f in files)}); keep one")
    for name in (VAE_FILE, CLIP_FILE):
        if not (path / name).is_file():
            raise FileNotFoundError(2, "file missing from the Matrix-Game 2.0 folder",
                                    str(path / name))
    return Layout(files[0], path / VAE_FILE, path / CLIP_FILE)


def convert_checkpoint(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A published checkpoint's tensors (prefixes allowed) under the model's names. Raises
    KeyConversionError listing keys that match nothing."""
    wan, out, unmatched = {}, {}, []
    for key, value in state.items():
        name = _strip_prefixes(key)
        parts = name.split(".")
        if len(parts) > 3 and parts[0] == "blocks" and parts[2] == "action_model":
            out[name] = value  # the action modules keep their names
        elif parts[:2] == ["img_emb", "proj"] and len(parts) == 4:
            inner = _IMAGE_EMBEDDING.get(parts[2])
            if inner is None:
                unmatched.append(key)
            else:
                out[f"condition_embedder.image_embedder.{inner}.{parts[3]}"] = value
        else:
            wan[name] = value
    try:
        out.update(original_to_diffusers(wan))
    except KeyConversionError as err:
        unmatched += err.unmatched
    if unmatched:
        raise KeyConversionError("checkpoint keys with no Matrix-Game 2.0 counterpart",
                                 unmatched)
    return out


def _keep_fp32(model: torch.nn.Module, name: str) -> bool:
    keep = getattr(model, "_keep_in_fp32_modules", None) or []
    return any(m in name.split(".") for m in keep)


def assign_weights(config: MatrixGameConfig, state: Mapping[str, torch.Tensor],
                   dtype: torch.dtype, device: torch.device) -> torch.nn.Module:
    """The DiT of ``config`` built on the meta device and given ``state`` (model names, full
    set: KeyConversionError listing missing and unexpected keys, ValueError on a shape), in
    ``dtype`` on ``device`` (time embedding, modulation tables and norms stay float32)."""
    from diffusers.models.transformers.transformer_wan import WanRotaryPosEmbed

    with torch.device("meta"):
        model = build_transformer(config)
    check_against_model(state, model)
    model.load_state_dict(dict(state), strict=True, assign=True)
    # the RoPE tables are buffers made on meta: build them again (no parameters)
    model.rope = WanRotaryPosEmbed(config.dim // config.num_heads, config.patch_size, 1024)
    for name, p in model.named_parameters():
        p.data = p.data.to(device, torch.float32 if _keep_fp32(model, name) else dtype)
    return model.to(device).eval()


def read_checkpoint(file: Path) -> dict[str, torch.Tensor]:
    """The tensors of a ``.safetensors`` (memory-mapped) or ``.pt``/``.pth`` file
    (``weights_only``); ValueError for another kind of file."""
    if file.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(file))
    if file.suffix in (".pt", ".pth"):
        state = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
        if not isinstance(state, Mapping):
            raise ValueError(f"{file}: expected a dict of tensors, got {type(state).__name__}")
        return dict(state)
    raise ValueError(f"{file}: unknown checkpoint type {file.suffix!r}")


def load_transformer(file: Path, config: MatrixGameConfig, dtype: torch.dtype,
                     device: torch.device) -> torch.nn.Module:
    """A variant's DiT from its published checkpoint (see :func:`assign_weights`)."""
    return assign_weights(config, convert_checkpoint(read_checkpoint(file)), dtype, device)


def load_image_encoder(file: Path, dtype: torch.dtype, device: torch.device):
    """The CLIP visual tower of the published CLIP file (its ``visual.*`` tensors)."""
    from worldstream.engine.models.matrix_game.image_encoder import ImageEncoder

    state = {k: v for k, v in read_checkpoint(file).items() if k.startswith("visual.")}
    with torch.device("meta"):
        encoder = ImageEncoder()
    encoder.load_state_dict(state, strict=True, assign=True)
    return encoder.to(device, dtype).eval()


def load_vae(file: Path, dtype: torch.dtype, device: torch.device):
    """diffusers' ``AutoencoderKLWan`` (the Wan2.1 configuration) with ``Wan2.1_VAE.pth``."""
    from diffusers import AutoencoderKLWan

    from worldstream.engine.models.matrix_game.vae_convert import original_vae_to_diffusers

    state = original_vae_to_diffusers(read_checkpoint(file))
    with torch.device("meta"):
        vae = AutoencoderKLWan()
    check_against_model(state, vae)
    vae.load_state_dict(state, strict=True, assign=True)
    return vae.to(device, dtype).eval()
