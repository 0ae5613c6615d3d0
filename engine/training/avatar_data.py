"""The avatar model's dataset: recorded avatar shards (see ``avatar.recorder``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from worldstream.engine.training.data import HELDOUT_SEED0, record_missing
from worldstream.engine.worlds.avatar.recorder import record_shard

NUM_SHARDS = 4
EPISODES_PER_SHARD = 64
EPISODE_FRAMES = 64
# a look switch every ~200 frames: ~4% of 8-frame clips hold one (the model learns to
# restyle; the avatar's demos switch looks rarely)
SWITCH_PROB = 1 / 200
#: training seeds start here (they stay below HELDOUT_SEED0, apart from the landscape's)
TRAIN_SEED0 = 10_000


def ensure_dataset(root: Path, num_shards: int = NUM_SHARDS,
                   workers: int = 1) -> tuple[list[Path], Path]:
    """Record missing shards (deterministic seeds; ``workers`` processes, see
    ``engine.training.data.record_missing``); return (training shard dirs, held-out dir)."""
    shards = [root / f"shard{k}" for k in range(num_shards)]
    jobs: list[tuple] = [
        (d, list(range(TRAIN_SEED0 + k * EPISODES_PER_SHARD,
                       TRAIN_SEED0 + (k + 1) * EPISODES_PER_SHARD)), EPISODE_FRAMES, SWITCH_PROB)
        for k, d in enumerate(shards)
    ]
    held = root / "ae_heldout"
    jobs.append((held, list(range(HELDOUT_SEED0, HELDOUT_SEED0 + 16)), EPISODE_FRAMES))
    record_missing(record_shard, jobs, workers)
    for job in jobs:  # shards recorded before the recorder saved their seeds
        if not (job[0] / "seed.npy").exists():
            np.save(job[0] / "seed.npy", np.asarray(job[1], np.int64))
    return shards, held
