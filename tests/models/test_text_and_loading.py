"""Prompt embeddings (shipped sentence-embedding model) and loading of the shipped weights."""

import numpy as np
import pytest

from worldstream.engine.backends.sampler import step_sigmas
from worldstream.engine.models.builtin import text
from worldstream.engine.models.builtin.loading import (
    BUILTIN_DIR,
    load_autoencoder,
    load_world_model,
)


def test_embeddings_are_cached_unit_vectors_and_blend():
    a = text.embed("a snowy forest")
    assert a.shape == (384,) and a.dtype == np.float32
    assert np.linalg.norm(a) == pytest.approx(1.0, abs=1e-5)
    assert text.embed("a snowy forest") is a  # cached by prompt string
    b = text.embed("hot desert dunes")
    mid = text.embed_blend("a snowy forest", "hot desert dunes", 0.5)
    assert np.dot(mid, a) > np.dot(b, a) and np.dot(mid, b) > np.dot(a, b)
    assert np.allclose(text.embed_blend("a snowy forest", "hot desert dunes", 0.0), a)
    with pytest.raises(ValueError):
        text.embed("   ")
    with pytest.raises(ValueError):
        text.embed_blend("a", "b", 1.5)


def test_prompts_find_their_scene():
    assert text.scene_for_prompt("a frozen lake in winter") == "snow"
    assert text.scene_for_prompt("sand dunes and cactus") == "desert"


def test_shipped_weights_load():
    model, ae = load_world_model(), load_autoencoder()
    assert model.config.latent_channels == ae.config.latent_channels
    assert sum(p.numel() for p in model.parameters()) > 1e6


def test_missing_and_corrupt_weights_name_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_world_model(tmp_path)
    bad = tmp_path / "transformer"
    bad.mkdir()
    (bad / "config.json").write_text((BUILTIN_DIR / "transformer" / "config.json").read_text())
    (bad / "diffusion_pytorch_model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ValueError, match=str(bad)):
        load_world_model(bad)


def test_step_sigmas_follow_the_shifted_schedule():
    # shift s maps sigma to s*sigma / (1 + (s-1)*sigma) (SD3); hand-worked for s = 2
    assert step_sigmas(4, 2.0) == pytest.approx([1.0, 6 / 7, 2 / 3, 0.4], abs=1e-6)
    assert step_sigmas(1, 3.0) == pytest.approx([1.0])
    with pytest.raises(ValueError):
        step_sigmas(5, 2.0)


def test_a_text_table_serves_its_prompts_without_the_model(tmp_path, monkeypatch):
    """``write_table`` then ``use_table``: the table's vectors are served as the model gave
    them, with the model made unreachable (a GPU machine without the text-model package);
    a prompt not in the table still goes to the model; a table of the wrong shape or of
    vectors that are not unit vectors is refused and changes nothing."""
    prompts = ["a table-served prompt", "another table-served prompt"]
    want = [text.embed(p).copy() for p in prompts]
    path = tmp_path / "table.npz"
    text.write_table(path, prompts)
    text._embed_cached.cache_clear()
    monkeypatch.setattr(text, "_table", {})
    assert text.use_table(path) == 2

    def no_model():
        raise AssertionError("the model was asked")

    monkeypatch.setattr(text, "_model", no_model)
    for p, w in zip(prompts, want):
        np.testing.assert_array_equal(text.embed(p), w)
    with pytest.raises(AssertionError, match="the model was asked"):
        text.embed("a prompt the table lacks")
    bad = tmp_path / "bad.npz"
    np.savez(bad, prompts=np.array(["x"]), vectors=np.full((1, 384), 0.5, np.float32))
    with pytest.raises(ValueError, match="unit vectors"):
        text.use_table(bad)
    np.savez(bad, prompts=np.array(["x", "y"]), vectors=np.zeros((1, 384), np.float32))
    with pytest.raises(ValueError, match="unit vectors"):
        text.use_table(bad)
    assert set(text._table) == set(prompts)
    text._embed_cached.cache_clear()  # later tests get the model's embeddings again
