"""Record a game played by a person-like :class:`~engine.worlds.game.policy.Player` (taps,
holds, pauses, FIRE at each start and after each lost ball) into a dataset folder, in parallel
processes.

Each shard is one process's work: episodes with seeds ``seed + 1000 * shard + k`` until the
shard holds ``shard_frames`` frames. Each episode is cut at a length drawn log-uniformly from
``[min_episode, max_episode]`` frames (or ends before, at a game over): sessions start at the
game's reset frame, so the recording holds many starts, not a few games played to the end.
The folder appears only when every shard is written (recorded into ``OUT.partial`` and
renamed), so a failed or interrupted recording leaves nothing half-written behind.
"""

from __future__ import annotations

import multiprocessing
import shutil
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import numpy as np
from tqdm import tqdm

from worldstream.engine.worlds.game import dataset
from worldstream.engine.worlds.game.env import GameEnv
from worldstream.engine.worlds.game.policy import RECORDING, Player

#: seeds of recorded episodes are below this; evaluation's held-out episodes start above it
HELD_OUT_SEED = 1_000_000


def record_shard(env_id: str, size: int, seed: int, shard: int, shard_frames: int,
                 max_episode: int, out: str, min_episode: int | None = None) -> int:
    """Play and write shard ``shard``; returns its frame count. ``min_episode`` None: every
    episode runs to ``max_episode`` frames (or its game over)."""
    game = GameEnv(env_id, size=size)
    rng = np.random.default_rng([seed, shard])
    policy = Player(game.action_meanings, rng, RECORDING)
    low = max_episode if min_episode is None else min(min_episode, max_episode)
    frames, actions, episode = [], [], []
    k = 0
    while len(frames) < shard_frames:
        episode_seed = seed + 1000 * shard + k
        k += 1
        frame = game.reset(episode_seed)
        policy.reset()
        length = int(round(np.exp(rng.uniform(np.log(low), np.log(max_episode)))))
        for t in range(length):
            action = policy()
            frames.append(frame)
            episode.append(episode_seed)
            last = t == length - 1 or len(frames) >= shard_frames
            actions.append(-1 if last else action)
            if last:
                break
            frame = game.step(action)
            if game.setback:
                policy.setback()
            if game.done:  # the frame after the last action ends the episode
                frames.append(frame)
                episode.append(episode_seed)
                actions.append(-1)
                break
    game.close()
    dataset.write_shard(Path(out) / f"shard-{shard:05d}.npz", np.stack(frames),
                        np.asarray(actions), np.asarray(episode))
    return len(frames)


def record(env_id: str, out: str | Path, frames: int, *, size: int = 64, seed: int = 0,
           workers: int = 2, shard_frames: int = 2000, max_episode: int = 2000,
           min_episode: int = 150, progress: bool = True) -> dict:
    """Record ``frames`` frames (rounded up to whole shards) of ``env_id`` into ``out``; the
    dataset's meta dict. ValueError (nothing written) for a bad env id or arguments, or an
    ``out`` that already holds files."""
    out = Path(out)
    if frames < 1 or workers < 1 or shard_frames < 2 or not 2 <= min_episode <= max_episode:
        raise ValueError("frames, workers must be >= 1; shard_frames >= 2; 2 <= min_episode "
                         "<= max_episode")
    if not 0 <= seed < HELD_OUT_SEED - 1000 * (frames // shard_frames + 1):
        raise ValueError(f"seed must leave recorded seeds below {HELD_OUT_SEED}")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"{out} exists and is not an empty folder; choose another --out")
    probe = GameEnv(env_id, size=size)  # bad ids fail here, before any process starts
    meanings = probe.action_meanings
    probe.close()
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    shards = -(-frames // shard_frames)
    try:
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=min(workers, shards), mp_context=ctx) as pool:
            jobs = [pool.submit(record_shard, env_id, size, seed, i, shard_frames, max_episode,
                                str(partial), min_episode) for i in range(shards)]
            bar = tqdm(total=shards * shard_frames, unit="frame", disable=not progress,
                       desc=f"record {env_id}")
            total = 0
            for job in as_completed(jobs):
                n = job.result()
                total += n
                bar.update(n)
            bar.close()
        meta = {"env": env_id, "size": size, "action_meanings": list(meanings),
                "frames": total, "shards": shards, "seed": seed, "policy": "player",
                "episodes_cut": [min_episode, max_episode]}
        dataset.publish(partial, out, meta)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return meta
