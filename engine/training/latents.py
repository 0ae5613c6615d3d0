"""Pre-encoded training data for the world model: every recorded frame encoded once by the
trained autoencoder (kept in RAM, float16), plus the prompt-embedding table."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from engine import text
from engine.models.autoencoder import frames_to_tensor
from engine.training.common import pick_device
from engine.worlds.recorder import PROMPTS, load_shard


@dataclass
class LatentDataset:
    """``latents (E, L, C, 16, 16)`` float16, ``actions/prompt (E, L)`` int64,
    ``prompt_emb (num_prompts, 384)`` float32, ``camera (E, L, 2)`` int64 crop origin of each
    frame in world pixels (the simulator's ground-truth camera path)."""

    latents: torch.Tensor
    actions: torch.Tensor
    prompt: torch.Tensor
    prompt_emb: torch.Tensor
    camera: torch.Tensor

    def sample(self, rng: np.random.Generator, batch: int, frames: int):
        """Random clips: latents ``(B, F, C, h, w)`` float32, actions ``(B, F)``,
        text ``(B, F, 384)``, camera ``(B, F, 2)`` float32 world pixels."""
        e = torch.as_tensor(rng.integers(0, self.latents.shape[0], batch))
        s = torch.as_tensor(rng.integers(0, self.latents.shape[1] - frames + 1, batch))
        idx = s[:, None] + torch.arange(frames)[None]
        lat = self.latents[e[:, None], idx].float()
        return (
            lat,
            self.actions[e[:, None], idx],
            self.prompt_emb[self.prompt[e[:, None], idx]],
            self.camera[e[:, None], idx].float(),
        )


@torch.no_grad()
def encode_shards(ae, shard_dirs: list[Path], cache: Path | None = None) -> LatentDataset:
    """Encode every frame of the shards (cached to ``cache`` as a .pt file when given)."""
    if cache is not None and cache.exists():
        return LatentDataset(**torch.load(cache))
    device = pick_device()
    ae = ae.to(device).eval()
    lats, acts, prompts, cams = [], [], [], []
    for d in shard_dirs:
        shard = load_shard(d)
        frames = shard["frames"]
        e, n = frames.shape[:2]
        out = torch.empty(e, n, ae.config.latent_channels, 16, 16, dtype=torch.float16)
        for i in tqdm(range(e), desc=f"encoding {d.name}", unit="episode"):
            # fp32: bf16 convolutions run ~6x slower than fp32 on this CPU (oneDNN)
            out[i] = ae.encoder(frames_to_tensor(np.array(frames[i])).to(device)).float().cpu()
        lats.append(out)
        acts.append(torch.as_tensor(np.asarray(shard["actions"]), dtype=torch.int64))
        prompts.append(torch.as_tensor(np.asarray(shard["prompt"]), dtype=torch.int64))
        cams.append(torch.as_tensor(np.asarray(shard["camera"]), dtype=torch.int64))
    emb = torch.as_tensor(np.stack([text.embed(p) for p in PROMPTS]))
    data = LatentDataset(
        torch.cat(lats), torch.cat(acts), torch.cat(prompts), emb, torch.cat(cams)
    )
    if cache is not None:
        cache.parent.mkdir(parents=True, exist_ok=True)
        torch.save(data.__dict__, cache)
    return data
