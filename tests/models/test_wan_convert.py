"""Original Wan key naming <-> diffusers WanTransformer3DModel names (synthetic state dicts)."""

from __future__ import annotations

import pytest
import torch
from diffusers import WanTransformer3DModel
from safetensors.torch import save_file

from worldstream.engine.models.wan.convert import (
    KeyConversionError,
    check_against_model,
    diffusers_to_original,
    load_causal_state_dict,
    original_to_diffusers,
)

TINY = dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=16, in_channels=4,
            out_channels=4, text_dim=8, freq_dim=16, ffn_dim=32, num_layers=2)


def _original_shapes(dim=32, ffn=32, text=8, freq=16, cin=4, layers=2):
    """The parameter shapes of the original Wan2.1 ``WanModel`` (T2V), written by hand from its
    module definitions (not derived from the converter)."""
    shapes = {
        "patch_embedding.weight": (dim, cin, 1, 2, 2), "patch_embedding.bias": (dim,),
        "text_embedding.0.weight": (dim, text), "text_embedding.0.bias": (dim,),
        "text_embedding.2.weight": (dim, dim), "text_embedding.2.bias": (dim,),
        "time_embedding.0.weight": (dim, freq), "time_embedding.0.bias": (dim,),
        "time_embedding.2.weight": (dim, dim), "time_embedding.2.bias": (dim,),
        "time_projection.1.weight": (6 * dim, dim), "time_projection.1.bias": (6 * dim,),
        "head.head.weight": (cin * 4, dim), "head.head.bias": (cin * 4,),
        "head.modulation": (1, 2, dim),
    }
    for n in range(layers):
        b = f"blocks.{n}."
        for attn in ("self_attn", "cross_attn"):
            for proj in "qkvo":
                shapes[f"{b}{attn}.{proj}.weight"] = (dim, dim)
                shapes[f"{b}{attn}.{proj}.bias"] = (dim,)
            shapes[f"{b}{attn}.norm_q.weight"] = (dim,)
            shapes[f"{b}{attn}.norm_k.weight"] = (dim,)
        shapes[f"{b}norm3.weight"] = (dim,)
        shapes[f"{b}norm3.bias"] = (dim,)
        shapes[f"{b}ffn.0.weight"] = (ffn, dim)
        shapes[f"{b}ffn.0.bias"] = (ffn,)
        shapes[f"{b}ffn.2.weight"] = (dim, ffn)
        shapes[f"{b}ffn.2.bias"] = (dim,)
        shapes[f"{b}modulation"] = (1, 6, dim)
    return shapes


def _synthetic(prefix=""):
    g = torch.Generator().manual_seed(0)
    return {prefix + k: torch.randn(s, generator=g) for k, s in _original_shapes().items()}


def test_hand_checked_names():
    conv = original_to_diffusers(_synthetic())
    sd = _synthetic()
    for orig, new in [("blocks.1.self_attn.o.weight", "blocks.1.attn1.to_out.0.weight"),
                      ("blocks.0.cross_attn.k.bias", "blocks.0.attn2.to_k.bias"),
                      ("blocks.0.norm3.weight", "blocks.0.norm2.weight"),
                      ("blocks.1.ffn.0.weight", "blocks.1.ffn.net.0.proj.weight"),
                      ("blocks.1.modulation", "blocks.1.scale_shift_table"),
                      ("head.modulation", "scale_shift_table"),
                      ("head.head.bias", "proj_out.bias"),
                      ("time_projection.1.weight", "condition_embedder.time_proj.weight"),
                      ("text_embedding.2.bias", "condition_embedder.text_embedder.linear_2.bias")]:
        assert torch.equal(conv[new], sd[orig])


@pytest.mark.parametrize("prefix", ["", "model.", "generator.model.", "_fsdp_wrapped_module.",
                                    "model._orig_mod."])
def test_round_trip_and_strict_load(prefix):
    original = _synthetic(prefix)
    converted = original_to_diffusers(original)
    model = WanTransformer3DModel(**TINY)
    check_against_model(converted, model)
    model.load_state_dict(converted, strict=True)  # every name and shape is diffusers'
    back = diffusers_to_original(model.state_dict())
    assert set(back) == {k[len(prefix):] for k in original}
    for k, v in back.items():
        assert torch.equal(v, original[prefix + k])


def test_wrapper_names_inside_keys_are_removed():
    sd = {k.replace("blocks.0.", "blocks.0._checkpoint_wrapped_module."): v
          for k, v in _synthetic("model._fsdp_wrapped_module.").items()}
    assert set(original_to_diffusers(sd)) == set(original_to_diffusers(_synthetic()))


def test_unmatched_keys_are_listed():
    sd = _synthetic()
    sd["blocks.0.lora_A.weight"] = torch.zeros(1)
    sd["img_emb.proj.0.weight"] = torch.zeros(1)
    with pytest.raises(KeyConversionError) as err:
        original_to_diffusers(sd)
    assert err.value.unmatched == ["blocks.0.lora_A.weight", "img_emb.proj.0.weight"]
    assert "blocks.0.lora_A.weight" in str(err.value)


def test_missing_keys_and_wrong_sizes_against_model():
    converted = original_to_diffusers(_synthetic())
    del converted["blocks.1.attn2.to_v.bias"]
    with pytest.raises(KeyConversionError, match="missing blocks.1.attn2.to_v.bias"):
        check_against_model(converted, WanTransformer3DModel(**TINY))
    converted = original_to_diffusers(_synthetic())
    with pytest.raises(ValueError, match="another model size"):
        check_against_model(converted, WanTransformer3DModel(**{**TINY, "ffn_dim": 64}))


def test_checkpoint_files(tmp_path):
    ckpt = {"generator": _synthetic("model."), "generator_ema": _synthetic("model."),
            "step": 7}
    ckpt["generator_ema"]["model.head.head.bias"] = torch.full((16,), 3.0)
    torch.save(ckpt, tmp_path / "sf.pt")
    got = load_causal_state_dict(tmp_path / "sf.pt")
    assert torch.equal(got["proj_out.bias"], torch.full((16,), 3.0))  # the EMA weights
    save_file(_synthetic(), str(tmp_path / "c.safetensors"))
    assert len(load_causal_state_dict(tmp_path / "c.safetensors")) == len(_original_shapes())
    with pytest.raises(FileNotFoundError, match="causal checkpoint not found"):
        load_causal_state_dict(tmp_path / "nope.pt")
    (tmp_path / "x.bin").write_bytes(b"")
    with pytest.raises(ValueError, match="unknown checkpoint type"):
        load_causal_state_dict(tmp_path / "x.bin")
