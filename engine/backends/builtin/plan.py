"""The ``plan`` stage: each chunk's camera path, its frames' memory reads and their encoded
memory bases (and, for a model with a rig, the poses and the pose-warped second source).

The model's learned camera dynamics turn the chunk's actions into per-frame camera positions
(integer world pixels); each frame's window is read from the spatial memory at its position,
once, with planes saying where memory holds current and stale content.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from worldstream.engine.backends.builtin.bases import picture_key
from worldstream.engine.backends.builtin.state import BuiltinState, ChunkRecord, MemoryViews
from worldstream.engine.backends.stages import ChunkBatch
from worldstream.engine.models.builtin.spatial_memory import model_inputs

if TYPE_CHECKING:
    from worldstream.engine.backends.builtin.protocol import BuiltinRunner


def plan(backend: BuiltinRunner, batch: ChunkBatch) -> None:
    """Stage: the batch's records and memory views from its jobs' actions."""
    batch.records, batch.views = plan_chunks(backend, batch.states,
                                             [job.actions for job in batch.jobs])


def plan_chunks(backend: BuiltinRunner, states: list[BuiltinState], actions: list[list[int]],
                move: bool = True) -> tuple[list[ChunkRecord], MemoryViews]:
    """Each state's next chunk up to its latents, and what memory showed each frame.

    ``actions``: per state, the chunk's per-frame action ids. ``move``: False for frames
    given rather than stepped (start frames): the camera and the rig stay where they are and
    no prompt-switch countdown advances."""
    cfg = backend.config
    records, pictures, current, refining, warped = [], [], [], [], []
    rig = backend.pose_rig
    skip_warped = backend.model.config.skip_source == "warped"
    for state, acts in zip(states, actions):
        if move and state.restyle_left > 0:
            state.memory.new_epoch()  # what was shown before now reads as stale
            state.restyle_left -= 1
        guided = move and cfg.guidance != 1 and (cfg.guidance_chunks is None
                                                 or state.guide_left > 0)
        if move and state.guide_left > 0:
            state.guide_left -= 1
        pos, vel = state.camera
        if move:
            disp, vel = backend.model.camera.rollout(
                vel.to(backend.device), torch.tensor(acts, device=backend.device))
            path = pos + np.cumsum(disp.cpu().double().numpy(), axis=0)
        else:
            path = np.repeat(pos[None], len(acts), axis=0)
        origins = np.floor(path).astype(np.int64)
        poses = None
        if rig is not None:
            pose = state.pose(rig.rest)
            poses = rig.path(pose, acts) if move else np.repeat(pose[None], len(acts), 0)
        known = []
        for i, (x0, y0) in enumerate(origins):
            read = state.memory.read(x0, y0, backend.width)
            rgb, planes = model_inputs(read, backend.downsample)
            if skip_warped:
                warped.append(rig.apply(rgb, poses[i]))
            pictures.append(rgb)
            current.append(read.current)
            refining.append(read.refining)
            known.append(torch.as_tensor(planes))
        records.append(ChunkRecord(
            None, None, torch.stack(known), list(acts), state.position, origins,
            (path[-1], vel.float().cpu()), guided=guided,
            field_times=np.zeros(len(acts), np.int64),
            pose=np.zeros(2) if poses is None else poses[-1], poses=poses))
    keys = [picture_key(p) for p in pictures]
    base = backend.base_cache.encode(backend, pictures, keys)
    skip = (backend.base_cache.encode(backend, warped, [picture_key(p) for p in warped])
            if warped else None)
    views = MemoryViews(np.stack(pictures), np.stack(current), base, keys, np.stack(refining))
    f = len(actions[0])
    for n, (state, rec) in enumerate(zip(states, records)):
        rec.base = base[n * f:(n + 1) * f]
        if skip is not None:
            rec.skip = skip[n * f:(n + 1) * f]
        if cfg.ctx_noise and cfg.ctx_sigma > 0:
            # the bases as noisy context, as the model saw them in training
            eps = torch.randn(rec.base.shape, generator=state.rng)
            rec.base = (1 - cfg.ctx_sigma) * rec.base + cfg.ctx_sigma * eps
            if rec.skip is not None:
                eps = torch.randn(rec.skip.shape, generator=state.rng)
                rec.skip = (1 - cfg.ctx_sigma) * rec.skip + cfg.ctx_sigma * eps
    return records, views
