"""What the built-in family's stage modules use of their backend (``BuiltinBackend``), as a
``Protocol``: the stages annotate with it and never import the backend that lists them, so
imports go one way (backend -> stages)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch

if TYPE_CHECKING:
    from worldstream.engine.backends.builtin.config import BuiltinConfig
    from worldstream.engine.backends.paged_context import PagedAttentionContext


class BuiltinRunner(Protocol):
    """The built-in backend as its stages see it. Sizes in pixels; ``downsample``: pixels per
    latent cell; ``exclude``: the view box the memory leaves out; ``pose_rig``: the world's
    base warp (None without one); ``base_cache``: the bases' cache (``bases.BaseCache``)."""

    width: int
    height: int
    chunk_frames: int
    device: torch.device
    config: BuiltinConfig
    model: Any
    downsample: int
    exclude: Any
    pose_rig: Any
    base_cache: Any
    pages_per_chunk: int
    scratch_pages: list[int]

    def noise(self, generator: torch.Generator) -> torch.Tensor: ...

    def forward(self, x: torch.Tensor, sigma: float, cond: Any,
                ctx: PagedAttentionContext) -> torch.Tensor: ...

    def to_x0(self, x: torch.Tensor, sigma: float, out: torch.Tensor) -> torch.Tensor: ...

    def encode_frames(self, frames: np.ndarray) -> torch.Tensor: ...

    def decode_latents(self, latents: torch.Tensor) -> np.ndarray: ...
