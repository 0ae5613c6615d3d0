"""Recorded play on disk: a folder of shards and one ``meta.json``.

``shard-NNNNN.npz`` (compressed: game frames shrink tens of times) holds ``frames``
``(N, S, S, 3)`` uint8, ``actions`` ``(N,)`` int16 (the action taken after each frame; -1 on
an episode's last frame) and ``episode`` ``(N,)`` int64
(the episode's seed; episodes never cross shards). ``meta.json``: env id, frame size, action
meanings, frame and shard counts. Shards are written to a temporary name and renamed, so a
folder never holds half a shard.
"""

from __future__ import annotations

import json
import os
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from worldstream.engine.core.reader import MAX_META_BYTES, read_json_file


class DatasetError(ValueError):
    """A dataset folder that cannot be read as recorded play (names the file and why)."""


@dataclass
class Episodes:
    """Frames of many episodes back to back; ``starts[i]:starts[i + 1]`` is episode ``i``."""

    frames: np.ndarray   # (N, S, S, 3) uint8
    actions: np.ndarray  # (N,) int16, -1 at each episode's end
    starts: np.ndarray   # (E + 1,) int64
    seeds: np.ndarray    # (E,) int64

    def __len__(self) -> int:
        return len(self.frames)


def write_shard(path: Path, frames: np.ndarray, actions: np.ndarray,
                episode: np.ndarray) -> None:
    """Write one shard atomically (temporary file, then rename)."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as fh:
        np.savez_compressed(fh, frames=frames, actions=actions.astype(np.int16),
                            episode=episode.astype(np.int64))
    os.replace(tmp, path)


def write_meta(folder: Path, meta: dict) -> None:
    tmp = folder / "meta.json.tmp"
    tmp.write_text(json.dumps(meta, indent=1) + "\n")
    os.replace(tmp, folder / "meta.json")


def publish(partial: Path, out: Path, meta: dict) -> None:
    """Write ``meta`` into the finished ``partial`` folder and move it to ``out`` (absent or
    empty): a recording appears whole or not at all."""
    write_meta(partial, meta)
    if out.exists():
        out.rmdir()
    partial.rename(out)


def read_meta(folder: str | Path) -> dict:
    """The folder's ``meta.json``; DatasetError when it is missing or malformed."""
    path = Path(folder) / "meta.json"
    try:
        meta = read_json_file(path, MAX_META_BYTES)
    except ValueError as exc:
        if not path.exists():
            raise DatasetError(f"{folder} is not a recording: no meta.json (record one with "
                               "`worldstream record --env ID --out DIR`)") from None
        raise DatasetError(str(exc)) from None  # too large, too deep, not JSON, unreadable
    if not isinstance(meta, dict):
        raise DatasetError(f"{path}: not a JSON object")
    for key in ("env", "size", "action_meanings"):
        if key not in meta:
            raise DatasetError(f"{path}: missing {key!r}")
    meanings, size = meta["action_meanings"], meta["size"]
    if not isinstance(meta["env"], str) or not isinstance(size, int) or isinstance(size, bool) \
            or not 1 <= size <= 4096 or not isinstance(meanings, list) or not meanings or \
            not all(isinstance(m, str) for m in meanings):
        raise DatasetError(f"{path}: expected env (a string), size (an int in [1, 4096]) and "
                           "action_meanings (a list of strings)")
    return meta


def _read_shard(path: Path, size: int, num_actions: int) -> dict[str, np.ndarray]:
    try:
        loaded = np.load(path, allow_pickle=False)
        if not isinstance(loaded, np.lib.npyio.NpzFile):  # a .npy file, not a shard
            raise ValueError("not an .npz archive")
        with loaded as z:
            data = {k: z[k] for k in ("frames", "actions", "episode")}
    except (OSError, KeyError, ValueError, zipfile.BadZipFile, EOFError, zlib.error) as exc:
        raise DatasetError(f"{path}: corrupt shard ({' '.join(str(exc).split())}); delete it or "
                           "record again") from exc
    n = len(data["frames"]) if data["frames"].ndim else -1
    if data["frames"].shape[1:] != (size, size, 3) or data["frames"].dtype != np.uint8 or \
            data["actions"].shape != (n,) or data["episode"].shape != (n,) or \
            not np.issubdtype(data["actions"].dtype, np.integer) or \
            not np.issubdtype(data["episode"].dtype, np.integer):
        raise DatasetError(f"{path}: {data['frames'].shape} {data['frames'].dtype} frames, "
                           f"{data['actions'].shape} {data['actions'].dtype} actions, "
                           f"{data['episode'].shape} {data['episode'].dtype} episodes do not "
                           f"match ({size}, {size}, 3) uint8 frames with one int action and "
                           "episode each")
    if n and (data["actions"].max() >= num_actions or data["actions"].min() < -1):
        raise DatasetError(f"{path}: action ids outside [-1, {num_actions})")
    return data


def load(folder: str | Path, env_id: str | None = None, max_frames: int | None = None
         ) -> tuple[dict, Episodes]:
    """``(meta, episodes)`` of a recording; DatasetError for a missing or corrupt file, or a
    recording of another env than ``env_id``."""
    folder = Path(folder)
    meta = read_meta(folder)
    if env_id is not None and meta["env"] != env_id:
        raise DatasetError(f"{folder} records {meta['env']!r}, not {env_id!r}")
    shards = sorted(folder.glob("shard-*.npz"))
    if not shards:
        raise DatasetError(f"{folder}: no shard-*.npz files")
    parts, total = [], 0
    for path in shards:
        parts.append(_read_shard(path, int(meta["size"]), len(meta["action_meanings"])))
        total += len(parts[-1]["frames"])
        if max_frames is not None and total >= max_frames:
            break
    frames = np.concatenate([p["frames"] for p in parts])
    actions = np.concatenate([p["actions"] for p in parts])
    episode = np.concatenate([p["episode"] for p in parts])
    # a new episode wherever the seed changes or a shard begins
    edges = np.flatnonzero(np.diff(episode) != 0) + 1
    shard_edges = np.cumsum([len(p["frames"]) for p in parts])[:-1]
    starts = np.unique(np.concatenate([[0], edges, shard_edges, [len(frames)]]))
    return meta, Episodes(frames, actions, starts.astype(np.int64), episode[starts[:-1]])
