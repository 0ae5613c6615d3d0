"""Loading the Wan causal family from local directories only (no hub access at run time).

Expected layout of ``--model-path DIR`` (the diffusers-format Wan2.1-T2V-1.3B base, e.g.
``Wan-AI/Wan2.1-T2V-1.3B-Diffusers`` downloaded elsewhere, plus one causal checkpoint)::

    DIR/transformer/config.json          WanTransformer3DModel config (its weights are unused)
    DIR/vae/config.json + *.safetensors  AutoencoderKLWan
    DIR/text_encoder/config.json + *.safetensors   UMT5EncoderModel
    DIR/tokenizer/                       its tokenizer files
    DIR/causal.safetensors | DIR/causal.pt   the causal generator (original Wan key naming:
                                         Self-Forcing ``self_forcing_dmd.pt``, CausVid, ...)

Before anything large is read, :func:`check_dtype` refuses a dtype the device cannot run and
:func:`check_memory` compares an estimate (weights from file headers, the KV pool, a working
set) with the device's free memory.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from diffusers import AutoencoderKLWan, WanTransformer3DModel
from diffusers.models.transformers.transformer_wan import WanRotaryPosEmbed

from worldstream.engine.models.wan.convert import check_against_model, load_causal_state_dict

CHECKPOINT_NAMES = ("causal.safetensors", "causal.pt", "causal.pth")
_PARTS = ("transformer", "vae", "text_encoder", "tokenizer")
#: share of the free memory the estimate may use (allocator fragmentation, CUDA context)
_HEADROOM = 0.9


class InsufficientMemoryError(MemoryError):
    """The estimated footprint does not fit the device's free memory."""


@dataclass
class WanParts:
    transformer: WanTransformer3DModel
    vae: AutoencoderKLWan
    text_encoder: torch.nn.Module
    tokenizer: object


def check_dtype(dtype: torch.dtype, device: torch.device) -> None:
    """ValueError for a dtype ``device`` cannot run usefully: float16 on CPU (matmul under
    1 GFLOP/s on the dev CPU), bfloat16 on a GPU without bf16 support, or
    anything but float32/bfloat16/float16."""
    if dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"unsupported dtype {dtype}; use torch.bfloat16 (GPU) or float32")
    if device.type == "cpu" and dtype == torch.float16:
        raise ValueError("float16 is refused on CPU (its matmuls are unusably slow there); "
                         "use float32 or bfloat16")
    if (device.type == "cuda" and dtype == torch.bfloat16
            and not torch.cuda.is_bf16_supported()):
        raise ValueError(f"{torch.cuda.get_device_name(device)} has no bfloat16; use float16")


def find_checkpoint(path: Path, checkpoint: str | Path | None) -> Path:
    """The causal checkpoint: ``checkpoint`` if given, else the first of ``CHECKPOINT_NAMES``
    in ``path``. FileNotFoundError naming what was looked for."""
    if checkpoint is not None:
        found = Path(checkpoint)
        if not found.is_file():
            raise FileNotFoundError(2, "causal checkpoint not found", str(found))
        return found
    for name in CHECKPOINT_NAMES:
        if (path / name).is_file():
            return path / name
    raise FileNotFoundError(2, f"no causal checkpoint in {path} (looked for "
                            f"{', '.join(CHECKPOINT_NAMES)}; or pass checkpoint=FILE)",
                            str(path / CHECKPOINT_NAMES[0]))


def check_layout(path: Path) -> None:
    """FileNotFoundError naming the first missing folder or file of the layout above."""
    if not path.is_dir():
        raise FileNotFoundError(2, "Wan model directory not found", str(path))
    for part in _PARTS:
        if not (path / part).is_dir():
            raise FileNotFoundError(2, f"Wan model part missing ({part}/)", str(path / part))
    for part in ("transformer", "vae", "text_encoder"):
        if not (path / part / "config.json").is_file():
            raise FileNotFoundError(2, "config missing", str(path / part / "config.json"))
    for part in ("vae", "text_encoder"):
        if not list((path / part).glob("*.safetensors")):
            raise FileNotFoundError(2, "weights missing (*.safetensors)", str(path / part))


def count_parameters(folder: Path) -> int:
    """Parameters stored in a folder's ``*.safetensors`` files (headers only, nothing loaded)."""
    from safetensors import safe_open

    total = 0
    for file in sorted(folder.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            for key in f.keys():
                total += math.prod(f.get_slice(key).get_shape())
    return total


def transformer_parameters(config: dict) -> int:
    """Parameters of a WanTransformer3DModel built from ``config`` (on the meta device)."""
    with torch.device("meta"):
        model = WanTransformer3DModel.from_config(config)
    return sum(p.numel() for p in model.parameters())


def free_memory_bytes(device: torch.device) -> int:
    """Free memory of ``device``: CUDA ``mem_get_info``; on CPU ``MemAvailable``."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def check_memory(parts_bytes: dict[str, int], device: torch.device) -> None:
    """InsufficientMemoryError, with the breakdown in GiB, when the sum of ``parts_bytes``
    exceeds ``_HEADROOM`` of the device's free memory."""
    need = sum(parts_bytes.values())
    free = free_memory_bytes(device)
    if need > _HEADROOM * free:
        detail = ", ".join(f"{k} {v / 2**30:.2f}" for k, v in parts_bytes.items())
        raise InsufficientMemoryError(
            f"the Wan model needs about {need / 2**30:.1f} GiB on {device} ({detail} GiB) but "
            f"{free / 2**30:.1f} GiB are free; lower max_states or memory_chunks, or use a "
            "larger device")


def read_config(folder: Path) -> dict:
    try:
        return json.loads((folder / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"cannot read {folder / 'config.json'}: {err}") from err


def _keep_fp32(model: torch.nn.Module, name: str) -> bool:
    keep = getattr(model, "_keep_in_fp32_modules", None) or []
    return any(m in name.split(".") for m in keep)


def build_transformer(config: dict, state_dict: dict[str, torch.Tensor] | None,
                      dtype: torch.dtype, device: torch.device) -> WanTransformer3DModel:
    """A WanTransformer3DModel from ``config`` with ``state_dict`` (diffusers names; checked
    against the model first), or random weights when None. Modules diffusers keeps in fp32
    (time embedding, modulation tables, norms) stay fp32."""
    if state_dict is None:
        with torch.device(device):
            model = WanTransformer3DModel.from_config(config)
    else:
        with torch.device("meta"):
            model = WanTransformer3DModel.from_config(config)
        check_against_model(state_dict, model)
        model.load_state_dict(state_dict, strict=True, assign=True)
        # non-persistent RoPE tables were created on meta; rebuild them (no parameters)
        model.rope = WanRotaryPosEmbed(model.config.attention_head_dim,
                                       model.config.patch_size, model.config.rope_max_seq_len)
    for name, p in model.named_parameters():
        p.data = p.data.to(device, torch.float32 if _keep_fp32(model, name) else dtype)
    return model.to(device).eval()


def load_wan_parts(path: str | Path, checkpoint: str | Path | None, dtype: torch.dtype,
                   device: torch.device, extra_bytes: dict[str, int]) -> WanParts:
    """Check layout, dtype and memory (``extra_bytes``: the KV pool and working set the caller
    will allocate), then load every part from ``path`` with ``local_files_only``.

    Raises FileNotFoundError (missing file, named), ValueError (dtype, unreadable config,
    checkpoint shapes), KeyConversionError (unmatched checkpoint keys, listed),
    InsufficientMemoryError (estimate above free memory).
    """
    from transformers import AutoTokenizer, UMT5EncoderModel

    path = Path(path)
    check_layout(path)
    ckpt = find_checkpoint(path, checkpoint)
    check_dtype(dtype, device)
    size = torch.empty((), dtype=dtype).element_size()
    t_config = read_config(path / "transformer")
    check_memory({"transformer": transformer_parameters(t_config) * size,
                  "text_encoder": count_parameters(path / "text_encoder") * size,
                  "vae": count_parameters(path / "vae") * size, **extra_bytes}, device)
    transformer = build_transformer(t_config, load_causal_state_dict(ckpt), dtype, device)
    vae = AutoencoderKLWan.from_pretrained(path / "vae", torch_dtype=dtype,
                                           local_files_only=True).to(device).eval()
    text_encoder = UMT5EncoderModel.from_pretrained(path / "text_encoder", dtype=dtype,
                                                    local_files_only=True).to(device).eval()
    tokenizer = AutoTokenizer.from_pretrained(path / "tokenizer", local_files_only=True)
    return WanParts(transformer, vae, text_encoder, tokenizer)
