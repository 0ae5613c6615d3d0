"""Matrix-Game 2.0's published checkpoint layout at full size, on the meta device (shapes only,
nothing allocated): each variant's generator checkpoint (``model.`` prefix, original Wan names,
action modules in blocks 0-14), the Wan2.1 VAE and the CLIP visual tower load with no missing
and no unexpected key; an incomplete folder is refused naming the missing file."""

from __future__ import annotations

import pytest
import torch

from tests.fixtures.matrix_game import (
    published_clip_visual_keys,
    published_keys,
    published_vae_keys,
)
from worldstream.engine.core.registry import BackendUnavailableError, load_backend
from worldstream.engine.models.matrix_game import loading
from worldstream.engine.models.matrix_game.config import VARIANTS, get_variant
from worldstream.engine.models.matrix_game.transformer import build_transformer
from worldstream.engine.models.wan.convert import KeyConversionError


def meta_tensors(shapes: dict[str, tuple]) -> dict[str, torch.Tensor]:
    return {k: torch.empty(shape, device="meta") for k, shape in shapes.items()}


def missing_unexpected(state: dict, model: torch.nn.Module) -> tuple[int, int, list]:
    expected = model.state_dict()
    bad_shapes = [k for k in set(state) & set(expected)
                  if tuple(state[k].shape) != tuple(expected[k].shape)]
    return len(set(expected) - set(state)), len(set(state) - set(expected)), bad_shapes


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_published_generator_layout_loads_with_no_missing_or_unexpected_key(variant):
    config = get_variant(variant).config()  # the full-size published config
    published = meta_tensors(published_keys(config))
    converted = loading.convert_checkpoint(published)
    with torch.device("meta"):
        model = build_transformer(config)
    assert missing_unexpected(converted, model) == (0, 0, [])
    actions = {k for k in converted if ".action_model." in k}
    assert {int(k.split(".")[1]) for k in actions} == set(range(15))
    assert any("mouse_mlp" in k for k in actions) == (variant != "templerun")
    # and it is assigned (load_state_dict strict, assign=True) without allocating
    loaded = loading.assign_weights(config, converted, torch.bfloat16, torch.device("meta"))
    assert loaded.blocks[0].attn1.to_q.weight.dtype == torch.bfloat16
    assert loaded.blocks[14].action_model is not None and loaded.blocks[15].action_model is None


def test_published_vae_and_clip_layouts_load_with_no_missing_or_unexpected_key():
    from diffusers import AutoencoderKLWan

    from worldstream.engine.models.matrix_game.image_encoder import ImageEncoder
    from worldstream.engine.models.matrix_game.vae_convert import original_vae_to_diffusers

    vae_state = original_vae_to_diffusers(meta_tensors(published_vae_keys()))
    with torch.device("meta"):
        vae, encoder = AutoencoderKLWan(), ImageEncoder()
    assert missing_unexpected(vae_state, vae) == (0, 0, [])
    clip = meta_tensors(published_clip_visual_keys())
    assert missing_unexpected(clip, encoder) == (0, 0, [])
    encoder.load_state_dict(clip, strict=True, assign=True)


def test_keys_of_another_model_are_listed():
    with pytest.raises(KeyConversionError, match="blocks.0.cross_attn.k_img"):
        loading.convert_checkpoint({"model.blocks.0.cross_attn.k_img.weight": torch.zeros(1)})


def test_an_incomplete_folder_names_the_missing_file(tmp_path):
    universal = get_variant("universal")
    with pytest.raises(FileNotFoundError) as err:
        loading.check_layout(tmp_path, universal)
    assert err.value.filename == str(tmp_path / "base_distilled_model")
    (tmp_path / "base_distilled_model").mkdir()
    (tmp_path / "base_distilled_model" / "base_distill.safetensors").write_bytes(b"")
    with pytest.raises(FileNotFoundError) as err:
        loading.check_layout(tmp_path, universal)
    assert err.value.filename == str(tmp_path / "Wan2.1_VAE.pth")
    (tmp_path / "Wan2.1_VAE.pth").write_bytes(b"")
    with pytest.raises(BackendUnavailableError, match="models_clip_open-clip"):
        load_backend("matrix-game-2", model_path=str(tmp_path), variant="universal",
                     device="cpu")
    with pytest.raises(ValueError, match="unknown Matrix-Game 2.0 variant 'doom'"):
        load_backend("matrix-game-2", model_path=str(tmp_path), variant="doom", device="cpu")
