"""The image encoder of Matrix-Game 2.0: the visual tower of open-clip's XLM-RoBERTa ViT-H/14
(as Wan2.1 image-to-video ships it, ``models_clip_open-clip-xlm-roberta-large-vit-huge-14.pth``),
whose tokens after its second-to-last block are the DiT's cross-attention context.

A plain pre-norm ViT: 14x14 patches of a 224x224 picture, a class token, learned positions, a
layer norm before the blocks, 32 blocks of (norm, attention with a fused qkv projection,
norm, GELU MLP). Parameter names are the checkpoint's (``visual.*``; its text tower is not
loaded).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

#: the CLIP normalisation of the picture after it is mapped to [0, 1]
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


@dataclass(frozen=True)
class VisionConfig:
    """The visual tower's sizes (defaults: ViT-H/14 at 224: 257 tokens of 1280)."""

    image_size: int = 224
    patch_size: int = 14
    dim: int = 1280
    num_heads: int = 16
    num_layers: int = 32
    mlp_ratio: int = 4
    out_dim: int = 1024
    eps: float = 1e-5

    @property
    def num_tokens(self) -> int:
        return (self.image_size // self.patch_size) ** 2 + 1


class _LayerNorm(nn.LayerNorm):
    """Layer norm computed in float32 (the checkpoint's runs in fp32 under autocast)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x.float(), self.normalized_shape, self.weight.float(),
                            self.bias.float(), self.eps).type_as(x)


class _Attention(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.to_qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        q, k, v = self.to_qkv(x).view(b, n, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        return self.proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).flatten(2))


class _Block(nn.Module):
    def __init__(self, c: VisionConfig):
        super().__init__()
        self.norm1 = _LayerNorm(c.dim, eps=c.eps)
        self.attn = _Attention(c.dim, c.num_heads)
        self.norm2 = _LayerNorm(c.dim, eps=c.eps)
        self.mlp = nn.Sequential(nn.Linear(c.dim, c.dim * c.mlp_ratio), nn.GELU(),
                                 nn.Linear(c.dim * c.mlp_ratio, c.dim), nn.Dropout(0.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class VisionTower(nn.Module):
    """The ViT; :meth:`forward` returns the tokens after all blocks but the last."""

    def __init__(self, c: VisionConfig):
        super().__init__()
        self.config = c
        # 1. embeddings (no patch bias: a layer norm follows)
        self.patch_embedding = nn.Conv2d(3, c.dim, c.patch_size, c.patch_size, bias=False)
        self.cls_embedding = nn.Parameter(torch.zeros(1, 1, c.dim))
        self.pos_embedding = nn.Parameter(torch.zeros(1, c.num_tokens, c.dim))
        self.pre_norm = _LayerNorm(c.dim, eps=c.eps)
        # 2. blocks; 3. the pooled head, kept so the checkpoint loads whole (unused here)
        self.transformer = nn.Sequential(*[_Block(c) for _ in range(c.num_layers)])
        self.post_norm = _LayerNorm(c.dim, eps=c.eps)
        self.head = nn.Parameter(torch.zeros(c.dim, c.out_dim))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """``(B, 3, S, S)`` normalised pictures -> ``(B, num_tokens, dim)``."""
        x = self.patch_embedding(images.to(self.patch_embedding.weight.dtype))
        x = x.flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_embedding.expand(x.shape[0], -1, -1).to(x.dtype), x], 1)
        x = self.pre_norm(x + self.pos_embedding.to(x.dtype))
        # NOTE: the DiT was trained on the tokens before the last block ("use_31_block")
        return self.transformer[:-1](x)


class ImageEncoder(nn.Module):
    """``visual``: the :class:`VisionTower`; :meth:`encode` a frame."""

    def __init__(self, config: VisionConfig | None = None):
        super().__init__()
        self.visual = VisionTower(config or VisionConfig())

    @torch.no_grad()
    def encode(self, frame: np.ndarray) -> torch.Tensor:
        """An ``(H, W, 3)`` uint8 RGB frame -> ``(1, num_tokens, dim)`` tokens: squeezed to
        the tower's square size (bicubic), mapped to [0, 1], CLIP-normalised."""
        p = next(self.parameters())
        x = torch.from_numpy(np.ascontiguousarray(frame)).to(p.device).permute(2, 0, 1)[None]
        x = x.float() / 255.0
        size = self.visual.config.image_size
        x = F.interpolate(x, size=(size, size), mode="bicubic", align_corners=False)
        mean = torch.tensor(CLIP_MEAN, device=x.device).view(1, 3, 1, 1)
        std = torch.tensor(CLIP_STD, device=x.device).view(1, 3, 1, 1)
        return self.visual((x - mean) / std)
