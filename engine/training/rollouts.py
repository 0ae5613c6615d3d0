"""Free rollouts of the built-in world model on recorded episodes, the camera forced onto the
simulator's path, and the memory bases replayed from what it generated (on-policy data).

:func:`collect_rollouts` rolls the model out with the real inference path
(:class:`engine.backends.builtin.BuiltinBackend` with the world's streaming settings) on
recorded training episodes: their first frame, actions, prompts and scene switches. The camera
is *forced* onto the recorded path (:class:`ForcedCamera`), so every generated frame is aligned
with a true frame; the model's own camera path is kept alongside as a check.
:func:`onpolicy_bases` replays the generated frames through the spatial memory exactly as
:func:`~engine.training.latents.memory_bases` replays the reconstructions, and encodes the
bases: what the generator read, frame for frame.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from worldstream.engine.backends.builtin import BuiltinBackend
from worldstream.engine.core.backend import ChunkJob
from worldstream.engine.models.builtin.camera_dynamics import CameraDynamics
from worldstream.engine.models.builtin.spatial_memory import SETTLE_PX
from worldstream.engine.models.builtin.world_dit import WorldDiT
from worldstream.engine.training.latents import ae_encode, memory_bases
from worldstream.engine.worlds.recorder import PROMPTS, load_shard


@dataclass
class EpisodeSpec:
    """What :func:`collect_rollouts` replays, for ``E`` recorded episodes of ``L`` frames:
    ``first (E, F, S, S, 3)`` uint8 the true first chunk (the stream's start frames),
    ``actions (E, L)`` int64, ``prompt (E, L)`` int64 index into ``PROMPTS`` (the prompt in
    force at each frame), ``switch (E, L)`` bool (a scene switch at that frame), ``camera
    (E, L, 2)`` int64 the simulator's crop origins (world px), ``index (E,)`` int64 each
    episode's row in the :class:`LatentDataset`; ``prompt`` indexes the world's prompt table
    (the landscape's ``recorder.PROMPTS``, the avatar's ``looks.PROMPTS``)."""

    first: np.ndarray
    actions: np.ndarray
    prompt: np.ndarray
    switch: np.ndarray
    camera: np.ndarray
    index: np.ndarray


def load_episodes(shard_dirs: list[Path], index: np.ndarray, chunk_frames: int = 1) -> EpisodeSpec:
    """Episodes ``index`` (rows of the concatenated shards, as in ``encode_shards``)."""
    per = [load_shard(d) for d in shard_dirs]
    sizes = np.cumsum([0] + [p["actions"].shape[0] for p in per])
    rows = {k: [] for k in ("first", "actions", "prompt", "switch", "camera")}
    for g in np.asarray(index):
        s = int(np.searchsorted(sizes, g, side="right") - 1)
        e = int(g - sizes[s])
        rows["first"].append(np.array(per[s]["frames"][e, :chunk_frames]))
        for k in ("actions", "prompt", "switch", "camera"):
            rows[k].append(np.asarray(per[s][k][e]))
    return EpisodeSpec(
        np.stack(rows["first"]),
        np.stack(rows["actions"]).astype(np.int64),
        np.stack(rows["prompt"]).astype(np.int64),
        np.stack(rows["switch"]).astype(bool),
        np.stack(rows["camera"]).astype(np.int64),
        np.asarray(index, dtype=np.int64),
    )


class ForcedCamera(torch.nn.Module):
    """Stands in for a model's :class:`CameraDynamics` while collecting: ``rollout`` returns
    the next displacement queued in ``forced`` (``(T, 2)`` px, FIFO, one entry per
    ``rollout`` call, i.e. per chunk and state in the generator's batch order) instead of the
    predicted one, and logs the predicted one in ``predicted`` (the check). The velocity state
    stays the model's own."""

    def __init__(self, inner: CameraDynamics):
        super().__init__()
        self.inner = inner
        self.forced: deque[torch.Tensor] = deque()
        self.predicted: list[torch.Tensor] = []

    def forward(self, vel: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        return self.inner(vel, actions)

    @torch.no_grad()
    def rollout(self, vel: torch.Tensor, actions: torch.Tensor):
        disp, v = self.inner.rollout(vel, actions)
        self.predicted.append(disp.detach().cpu())
        if not self.forced:
            raise RuntimeError("ForcedCamera: no displacement queued for this chunk")
        return self.forced.popleft().to(disp), v


@contextlib.contextmanager
def forced_camera(model: WorldDiT):
    """Swap ``model.camera`` for a :class:`ForcedCamera` for the duration."""
    inner = model.camera
    wrapper = ForcedCamera(inner)
    model.camera = wrapper
    try:
        yield wrapper
    finally:
        model.camera = inner


@dataclass
class Rollouts:
    """Free rollouts of ``E`` episodes: ``frames (E, L, S, S, 3)`` uint8 what the generator
    showed (frame 0..F-1: the true start chunk), ``latents (E, L, C, h, w)`` float32 the
    model-space clean latents its cache fill consumed (the temporal context it attended to),
    ``camera (E, L, 2)`` int64 the crop origins the stream used, world px: the recorded path,
    except that the start chunk's frames all sit where its last one does (the stream places
    given start frames at one position; with 1-frame chunks the recorded path exactly),
    ``camera_err (E, L, 2)`` float64 px, the model's own camera path minus the forced one,
    both relative to the start chunk (the check)."""

    frames: np.ndarray
    latents: torch.Tensor
    camera: np.ndarray
    camera_err: np.ndarray


@torch.no_grad()
def collect_rollouts(
    gen: BuiltinBackend, eps: EpisodeSpec, steps: int = 4, seed: int = 0,
    prompts: Sequence[str] = PROMPTS,
) -> Rollouts:
    """Roll ``gen`` out on all of ``eps`` at once (one batched ``generate`` per chunk; the
    generator's ``max_states`` must be >= E): start from the true first chunk under the
    episode's first prompt, then each chunk's actions, with ``set_prompt`` before a chunk
    holding a scene switch (as the stream does: recache + new memory epoch) and the camera
    forced onto the recorded path; ``prompts`` the table ``eps.prompt`` indexes. Seeds:
    ``seed * 100_003 + episode index``. ValueError when
    ``gen`` restyles more than once per switch (the bases are replayed by ``memory_bases``,
    one memory epoch per switch)."""
    if gen.config.restyle_chunks != 1:
        raise ValueError("on-policy rollouts need restyle_chunks=1 (memory_bases replays one "
                         f"memory epoch per switch), got {gen.config.restyle_chunks}")
    f = gen.chunk_frames
    e, n = eps.actions.shape
    n = n // f * f
    states = [
        gen.new_state(
            prompts[eps.prompt[i, 0]], seed * 100_003 + int(eps.index[i]), start_frames=eps.first[i]
        )
        for i in range(e)
    ]
    frames = np.empty((e, n, gen.height, gen.width, 3), np.uint8)
    frames[:, :f] = eps.first
    camera = eps.camera[:, :n].copy()
    camera[:, : f - 1] = camera[:, f - 1 : f]
    true_path = (camera - camera[:, :1]).astype(np.float64)
    model_path = np.zeros((e, n, 2))
    latents = None
    try:
        with forced_camera(gen.model) as cam:
            for c in tqdm(range(1, n // f), desc="on-policy rollout", unit="chunk", leave=False):
                span = slice(c * f, (c + 1) * f)
                jobs = []
                for i, state in enumerate(states):
                    if eps.switch[i, span].any():
                        gen.set_prompt(state, prompts[eps.prompt[i, span][-1]])
                    # the chunk's displacements from the last frame of the previous chunk
                    disp = np.diff(true_path[i, c * f - 1 : (c + 1) * f], axis=0)
                    cam.forced.append(torch.as_tensor(disp, dtype=torch.float32))
                    jobs.append(ChunkJob(state, list(map(int, eps.actions[i, span])), steps))
                cam.predicted.clear()
                results = gen.generate(jobs)
                for i, res in enumerate(results):
                    if res.error:
                        raise res.error
                    frames[i, span] = res.frames
                    pred = cam.predicted[i].double().numpy()
                    model_path[i, span] = model_path[i, c * f - 1] + np.cumsum(pred, axis=0)
                gen.finish()  # cache fill + memory write, so history holds this chunk
                if latents is None:
                    lat0 = [s.history[0].latents for s in states]
                    latents = torch.empty(e, n, *lat0[0].shape[1:])
                    latents[:, :f] = torch.stack(lat0).float().cpu()
                for i, state in enumerate(states):
                    latents[i, span] = state.history[-1].latents.float().cpu()
    finally:
        for state in states:
            gen.free(state)
    return Rollouts(frames, latents, camera, model_path - true_path)


@torch.no_grad()
def onpolicy_bases(
    ae, rolls: Rollouts, eps: EpisodeSpec, chunk_frames: int, device: torch.device,
    model_config, settle_px: int = SETTLE_PX,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Memory bases of the generated frames, replayed as ``memory_bases`` replays the
    reconstructions, with the view box of the model (``model_config``, a :class:`WorldDiT`
    config) and the settle distance of the stream that generated them
    (``settle_px``, ``BuiltinConfig.memory_settle_px``), as the engine reads them: ``base (E,
    L, C, h, w)`` float16 raw autoencoder latents (encoded as the training data was,
    :func:`ae_encode`) and ``known (E, L, 2, h, w)`` uint8 (fractions × 255; equal to the
    original data's, since they depend only on the camera path and switches)."""
    bases, knowns = [], []
    n = rolls.frames.shape[1]
    for i in range(len(rolls.frames)):
        rgb, planes = memory_bases(
            rolls.frames[i], rolls.camera[i], eps.switch[i, :n], chunk_frames,
            model_config.view_box, settle_px=settle_px,
        )
        bases.append(ae_encode(ae, rgb, device).cpu().half())
        knowns.append(torch.as_tensor(planes * 255).round().to(torch.uint8))
    return torch.stack(bases), torch.stack(knowns)


