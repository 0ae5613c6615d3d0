"""The built-in family's ``noise`` stage: each chunk's initial noise.

With ``world_noise``, each frame's noise is read from a Gaussian field fixed in world
coordinates at the frame's camera window (``engine.models.builtin.world_noise``), so the
frames that generate the same new ground refine one sample of it; else fresh white noise.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from worldstream.engine.backends.stages import ChunkBatch
from worldstream.engine.models.builtin.world_noise import chunk_noise

if TYPE_CHECKING:
    from worldstream.engine.backends.builtin.protocol import BuiltinRunner


def noise(backend: BuiltinRunner, batch: ChunkBatch) -> None:
    """Stage: ``(B, F, C, h, w)`` float32 initial noise, from the field of each job's seed
    (else its stream's) or, without the field, from the job's seed or the state's
    generator."""
    rows = []
    for job, rec in zip(batch.jobs, batch.records):
        state = job.state
        if backend.config.world_noise:
            mc = backend.model.config
            seed = job.seed if job.seed is not None else state.noise_seed
            rows.append(chunk_noise(seed, rec.origins, backend.downsample, mc.latent_channels,
                                    mc.latent_size))
        else:
            rows.append(backend.noise(torch.Generator().manual_seed(job.seed)
                                       if job.seed is not None else state.rng))
    batch.noise = torch.stack(rows).to(backend.device)
