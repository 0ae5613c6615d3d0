"""Pre-encoded training data for the world model: every recorded frame encoded once by the
trained autoencoder (kept in RAM, float16), each frame's spatial-memory base as the engine would
read it, and the prompt-embedding table."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from worldstream.engine.models.builtin import text
from worldstream.engine.models.builtin.autoencoder import (
    DOWNSAMPLE,
    frames_to_tensor,
    tensor_to_frames,
)
from worldstream.engine.models.builtin.spatial_memory import (
    SETTLE_PX,
    SpatialMemory,
    centre_box,
    model_inputs,
)
from worldstream.engine.training.common import autocast, pick_device
from worldstream.engine.worlds.catalog import make_base_warp
from worldstream.engine.worlds.recorder import PROMPTS, load_shard
from worldstream.engine.worlds.simulator import SIZE, SPRITE

#: side of the view-anchored square never written to memory: the player sprite + 3 px margin
#: (decoded frames blur its colours outward)
VIEW_BOX = SPRITE + 6


@dataclass
class LatentDataset:
    """``latents (E, L, C, h, w)`` float16 (the frames), ``base (E, L, C, h, w)`` float16 (each
    frame's memory window, encoded), ``known (E, L, 2, h, w)`` uint8 (current/stale fractions
    × 255), ``actions/prompt (E, L)`` int64, ``prompt_emb (num_prompts, 384)`` float32,
    ``camera (E, L, 2)`` int64 crop origin of each frame in world pixels (the simulator's
    ground-truth camera path); ``pose (E, L, 2)`` float32 the rig's pose after each frame for a
    model conditioned on it (:func:`attach_poses`; None otherwise); ``skip (E, L, C, h, w)``
    float16 each frame's memory picture warped to that pose, encoded, for a model with a
    ``"warped"`` skip source (the ``base`` of :func:`encode_shards` with ``base_warp``; None
    otherwise)."""

    latents: torch.Tensor
    base: torch.Tensor
    known: torch.Tensor
    actions: torch.Tensor
    prompt: torch.Tensor
    prompt_emb: torch.Tensor
    camera: torch.Tensor
    pose: torch.Tensor | None = None
    skip: torch.Tensor | None = None

    def clip_index(self, rng: np.random.Generator, batch: int, frames: int):
        """Random clips' ``(rows (B, 1), frame indices (B, F))`` int64."""
        e = torch.as_tensor(rng.integers(0, self.latents.shape[0], batch))
        s = torch.as_tensor(rng.integers(0, self.latents.shape[1] - frames + 1, batch))
        return e[:, None], s[:, None] + torch.arange(frames)[None]

    def sample(self, rng: np.random.Generator, batch: int, frames: int):
        """Random clips (:meth:`clips` of :meth:`clip_index`)."""
        return self.clips(*self.clip_index(rng, batch, frames))

    def clips(self, rows: torch.Tensor, idx: torch.Tensor):
        """Clips at ``rows (B, 1)``, ``idx (B, F)``: latents, base ``(B, F, C, h, w)``
        float32, known ``(B, F, 2, h, w)`` float32 in [0, 1], actions ``(B, F)``, text
        ``(B, F, 384)``, camera ``(B, F, 2)`` float32 world pixels."""
        return (
            self.latents[rows, idx].float(),
            self.base[rows, idx].float(),
            self.known[rows, idx].float() / 255.0,
            self.actions[rows, idx],
            self.prompt_emb[self.prompt[rows, idx]],
            self.camera[rows, idx].float(),
        )


def attach_poses(data: LatentDataset, rig) -> None:
    """Set ``data.pose`` to the rig's pose path over each episode's actions from its ``rest``
    pose (``rig``: an ``engine.worlds.catalog.make_base_warp`` object, e.g. the avatar's
    head; the engine follows the same path)."""
    data.pose = torch.as_tensor(np.stack([
        rig.path(rig.rest, episode.tolist()) for episode in data.actions.numpy()
    ]), dtype=torch.float32)


def memory_bases(
    recon: np.ndarray, camera: np.ndarray, switch: np.ndarray, chunk_frames: int,
    view_box: int = VIEW_BOX, warp=None, actions: np.ndarray | None = None,
    settle_px: int = SETTLE_PX,
) -> tuple[np.ndarray, np.ndarray]:
    """Replay one episode through a :class:`SpatialMemory` as the engine does: each chunk's
    frames read their base at their camera position from the memory as of the chunk's start,
    then the chunk is written (best view, sprite excluded; the first chunk, a stream's real
    start frames, settled); a scene switch starts an epoch.

    ``recon (L, S, S, 3)`` uint8 the frames as the engine would have written them (autoencoder
    reconstructions: in a stream memory holds decoded frames), ``camera (L, 2)`` crop origins,
    ``switch (L,)`` bool, ``view_box`` the side of the centre square never written (px);
    ``warp`` a base warp (``engine.worlds.catalog.make_base_warp``) that moves each picture to
    the pose of the episode's avatar ``actions (L,)`` from its ``rest`` pose, as the engine
    does (None: the pictures as read); ``settle_px`` the memory's settle distance (16, as the
    shipped weights were trained; on-policy replays pass the stream's,
    ``BuiltinConfig.memory_settle_px``).
    Returns base pictures ``(L, S, S, 3)`` uint8 and known planes ``(L, 2, S/d, S/d)``
    float32."""
    memory = SpatialMemory(settle_px=settle_px)
    exclude = centre_box(recon.shape[1], view_box)
    bases, known = [], []
    for c in range(0, len(recon), chunk_frames):
        span = range(c, min(c + chunk_frames, len(recon)))
        if switch[span].any():
            memory.new_epoch()
        for i in span:
            rgb, planes = model_inputs(memory.read(*camera[i], recon.shape[1]), DOWNSAMPLE)
            bases.append(rgb)
            known.append(planes)
        for i in span:
            memory.write(*camera[i], recon[i], exclude, settled=c == 0)
    if warp is not None:
        poses = warp.path(warp.rest, np.asarray(actions).tolist())
        bases = [warp.apply(rgb, pose) for rgb, pose in zip(bases, poses)]
    return np.stack(bases), np.stack(known)


# NOTE: mini-batches of 4 frames: on one core a batch of 64 took 31 ms a frame to encode,
# a batch of 4 took 11 (the activations stay in cache); bf16 only where the CPU has it
@torch.no_grad()
def ae_encode(ae, frames: np.ndarray, device: torch.device) -> torch.Tensor:
    """``(N, S, S, 3)`` uint8 frames -> ``(N, C, S/d, S/d)`` float32 autoencoder latents
    (raw, not model-normalised), as the training data was encoded."""
    x = frames_to_tensor(frames).to(device)
    with autocast(device):
        return torch.cat([ae.encoder(x[i : i + 4]).float() for i in range(0, len(x), 4)])


@torch.no_grad()
def ae_decode(ae, z: torch.Tensor, device: torch.device) -> np.ndarray:
    """Raw autoencoder latents ``(N, C, h, w)`` -> ``(N, S, S, 3)`` uint8 frames."""
    with autocast(device):
        y = torch.cat([ae.decoder(z[i : i + 4].to(device)).float() for i in range(0, len(z), 4)])
    return tensor_to_frames(y.clamp(-1, 1)).cpu().numpy()


@torch.no_grad()
def encode_shards(
    ae, shard_dirs: list[Path], chunk_frames: int = 1, cache: Path | None = None,
    prompts: tuple[str, ...] = PROMPTS, view_box: int = VIEW_BOX, base_warp: str | None = None,
) -> LatentDataset:
    """Encode every frame of the shards and its memory base (cached to ``cache`` as a .pt file
    when given); ``prompts`` is the table the shards' prompt indices point into (the world's
    recorder's), ``view_box`` as in :func:`memory_bases`, ``base_warp`` the name of the warp
    (``engine.worlds.catalog.BASE_WARPS``) that moves each base picture to the pose of its
    frame's actions before it is encoded (None: none; a rig's name encodes the ``"warped"``
    skip source's pictures)."""
    if cache is not None and cache.exists():
        return LatentDataset(**torch.load(cache))
    device = pick_device()
    ae = ae.to(device).eval()
    c, g = ae.config.latent_channels, SIZE // DOWNSAMPLE
    warp = make_base_warp(base_warp, SIZE) if base_warp else None
    out: dict[str, list] = {k: [] for k in ("lat", "base", "known", "act", "prompt", "cam")}

    def encode(frames: np.ndarray) -> torch.Tensor:
        return ae_encode(ae, frames, device)

    def decode(z: torch.Tensor) -> np.ndarray:
        return ae_decode(ae, z, device)

    for d in shard_dirs:
        shard = load_shard(d)
        frames = shard["frames"]
        e, n = frames.shape[:2]
        lat = torch.empty(e, n, c, g, g, dtype=torch.float16)
        base = torch.empty(e, n, c, g, g, dtype=torch.float16)
        known = torch.empty(e, n, 2, g, g, dtype=torch.uint8)
        for i in tqdm(range(e), desc=f"encoding {d.name}", unit="episode"):
            z = encode(np.array(frames[i]))
            recon = decode(z)
            rgb, planes = memory_bases(
                recon, np.asarray(shard["camera"][i]), np.asarray(shard["switch"][i]), chunk_frames,
                view_box, warp, np.asarray(shard["actions"][i]),
            )
            lat[i] = z.cpu()
            base[i] = encode(rgb).cpu()
            known[i] = torch.as_tensor(planes * 255).round().to(torch.uint8)
        out["lat"].append(lat)
        out["base"].append(base)
        out["known"].append(known)
        for key, name in (("act", "actions"), ("prompt", "prompt"), ("cam", "camera")):
            out[key].append(torch.as_tensor(np.asarray(shard[name]), dtype=torch.int64))
    emb = torch.as_tensor(np.stack([text.embed(p) for p in prompts]))
    data = LatentDataset(
        torch.cat(out["lat"]),
        torch.cat(out["base"]),
        torch.cat(out["known"]),
        torch.cat(out["act"]),
        torch.cat(out["prompt"]),
        emb,
        torch.cat(out["cam"]),
    )
    if cache is not None:
        cache.parent.mkdir(parents=True, exist_ok=True)
        torch.save(data.__dict__, cache)
    return data
