"""The avatar model's dataset: recorded avatar shards (see ``avatar.recorder``)."""

from __future__ import annotations

from pathlib import Path

from worldstream.engine.training.data import HELDOUT_SEED0
from worldstream.engine.worlds.avatar.recorder import record_shard

NUM_SHARDS = 4
EPISODES_PER_SHARD = 64
EPISODE_FRAMES = 64
# a look switch every ~200 frames: ~4% of 8-frame clips hold one (the model learns to
# restyle; the avatar's demos switch looks rarely)
SWITCH_PROB = 1 / 200
#: training seeds start here (they stay below HELDOUT_SEED0, apart from the landscape's)
TRAIN_SEED0 = 10_000


def ensure_dataset(root: Path, num_shards: int = NUM_SHARDS) -> tuple[list[Path], Path]:
    """Record missing shards (deterministic seeds); return (training shard dirs, held-out dir)."""
    shards = []
    for k in range(num_shards):
        d = root / f"shard{k}"
        if not (d / "camera.npy").exists():
            s0 = TRAIN_SEED0 + k * EPISODES_PER_SHARD
            record_shard(d, list(range(s0, s0 + EPISODES_PER_SHARD)), EPISODE_FRAMES,
                         SWITCH_PROB)
        shards.append(d)
    held = root / "ae_heldout"
    if not (held / "camera.npy").exists():
        record_shard(held, list(range(HELDOUT_SEED0, HELDOUT_SEED0 + 16)), EPISODE_FRAMES)
    return shards, held
