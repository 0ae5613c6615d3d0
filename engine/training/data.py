"""The built-in model's dataset: recorded simulator shards (see ``engine.worlds.recorder``)."""

from __future__ import annotations

from pathlib import Path

from worldstream.engine.worlds.recorder import record_shard

NUM_SHARDS = 6
EPISODES_PER_SHARD = 64
EPISODE_FRAMES = 64
# a scene switch every ~48 frames: with 8-frame training clips ~15% of clips hold one, the only
# place the model learns to follow a new prompt (at the recorder's default 1/120 it was 6%)
SWITCH_PROB = 1 / 48
# instant switches: with the spatial memory a remembered pixel is restyled once, on the first
# frame it is seen under the new prompt, so the model must learn to jump to the new scene's
# look in one frame (a 12-frame cross-fade taught it to move 1/12 of the way and stop there)
TRANSITION_FRAMES = 0
HELDOUT_SEED0 = 900_000  # evaluation seeds start here; training seeds stay below


def ensure_dataset(root: Path, num_shards: int = NUM_SHARDS) -> tuple[list[Path], Path]:
    """Record missing shards (deterministic seeds); return (training shard dirs, held-out dir)."""
    shards = []
    for k in range(num_shards):
        d = root / f"shard{k}"
        if not (d / "camera.npy").exists():
            seeds = list(range(k * EPISODES_PER_SHARD, (k + 1) * EPISODES_PER_SHARD))
            record_shard(d, seeds, EPISODE_FRAMES, SWITCH_PROB, TRANSITION_FRAMES)
        shards.append(d)
    held = root / "ae_heldout"
    if not (held / "camera.npy").exists():
        record_shard(held, list(range(HELDOUT_SEED0, HELDOUT_SEED0 + 16)), EPISODE_FRAMES)
    return shards, held
