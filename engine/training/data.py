"""The built-in model's dataset: recorded simulator shards (see ``engine.worlds.recorder``)."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
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


def record_missing(record: Callable, jobs: list[tuple], workers: int = 1) -> None:
    """Run ``record(shard_dir, *args)`` for each ``(shard_dir, *args)`` job whose shard is not
    recorded yet (no ``camera.npy``), in ``workers`` processes (the simulators are numpy on
    one core each; a GPU machine's cores record its shards side by side). Each shard's seeds
    fix its content, so the result does not depend on ``workers``."""
    todo = [job for job in jobs if not (job[0] / "camera.npy").exists()]
    if workers <= 1 or len(todo) <= 1:
        for job in todo:
            record(*job)
        return
    with ProcessPoolExecutor(min(workers, len(todo))) as pool:
        list(pool.map(record, *zip(*todo)))


def ensure_dataset(root: Path, num_shards: int = NUM_SHARDS,
                   workers: int = 1) -> tuple[list[Path], Path]:
    """Record missing shards (deterministic seeds; ``workers`` processes, see
    :func:`record_missing`); return (training shard dirs, held-out dir)."""
    shards = [root / f"shard{k}" for k in range(num_shards)]
    jobs = [(d, list(range(k * EPISODES_PER_SHARD, (k + 1) * EPISODES_PER_SHARD)),
             EPISODE_FRAMES, SWITCH_PROB, TRANSITION_FRAMES) for k, d in enumerate(shards)]
    held = root / "ae_heldout"
    jobs.append((held, list(range(HELDOUT_SEED0, HELDOUT_SEED0 + 16)), EPISODE_FRAMES))
    record_missing(record_shard, jobs, workers)
    return shards, held
