"""``worldstream record``: a game's play as a dataset folder (``engine.worlds.game.dataset``):
played by a human-like policy in parallel processes (``--env ID --frames N``), or a browser
session of ``play --env ID`` replayed from its input log (``--from-log LOG``)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "record", help="record a game's play as a training dataset",
        description="Record a Gymnasium game (any id with image observations and discrete "
                    "actions, or module:factory) into a folder of shards, played by a "
                    "person-like player (taps, holds, pauses, the start action at each start "
                    "and after each lost ball; episodes cut at 150-2,000 frames) in parallel "
                    "processes; or turn the input log of a browser session of `play --env ID` "
                    "into the same format (--from-log). The folder appears only when complete. "
                    "A log is data: a game it names as module:factory is imported only when "
                    "--env names the same.")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--env", default=None, metavar="ID",
                        help="the game: a Gymnasium id (ALE/Pong-v5) or module:factory (your "
                             "own code: taken only from the command line, never from a log)")
    source.add_argument("--world", choices=_game_worlds(), default=None,
                        help="a named game world (its env)")
    parser.add_argument("--from-log", type=Path, default=None, metavar="LOG",
                        help="an input log exported from a session of `play --env ID` (with "
                             "--env ID: the log must be of that game)")
    parser.add_argument("--out", type=Path, required=True,
                        help="the dataset folder (new or empty)")
    parser.add_argument("--frames", type=int, default=20_000,
                        help="frames to record (rounded up to whole shards; default 20000)")
    parser.add_argument("--workers", type=int, default=2,
                        help="parallel recording processes (default 2)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the first episode and the policy (default 0)")
    parser.add_argument("--size", type=int, default=64,
                        help="frames are SIZE x SIZE (default 64)")
    parser.add_argument("--shard-frames", type=int, default=2000,
                        help="frames per shard (default 2000)")
    parser.add_argument("--state", type=Path, default=None,
                        help="with --from-log: the save point the logged session was loaded "
                             "from")
    parser.add_argument("--keymap", type=Path, default=None,
                        help="with --from-log: the key map the session was played with "
                             "(`play --keymap`)")
    parser.set_defaults(func=run)


def _game_worlds() -> tuple[str, ...]:
    from worldstream.engine.core.registry import GAME_WORLDS

    return tuple(GAME_WORLDS)


def _from_log(args: argparse.Namespace) -> dict:
    from worldstream.engine.backends.game.log_dataset import dataset_from_log
    from worldstream.engine.core.inputlog import MAX_LOG_BYTES
    from worldstream.engine.core.reader import read_bytes
    from worldstream.engine.studio.savepoint import MAX_SAVEPOINT_BYTES

    log = read_bytes(args.from_log, MAX_LOG_BYTES, what="input log")
    savepoint = None
    if args.state is not None:
        savepoint = read_bytes(args.state, MAX_SAVEPOINT_BYTES, what="save point")
    if args.keymap is not None and not args.keymap.is_file():
        raise FileNotFoundError(f"key map not found: {args.keymap}")
    model = None  # the game the command line named, if any: the log's must be the same
    if args.env is not None or args.world is not None:
        from worldstream.engine.core.registry import GAME_WORLDS, env_backend_id

        model = env_backend_id(args.env if args.env is not None else GAME_WORLDS[args.world])
    return dataset_from_log(log, args.out, name=str(args.from_log),
                            keymap=args.keymap, savepoint=savepoint,
                            shard_frames=args.shard_frames, model=model)


def run(args: argparse.Namespace) -> int:
    """Record, then print the dataset's meta as one JSON line. ValueError (one line, exit 2,
    nothing written) for a bad env, argument or a non-empty --out."""
    if args.from_log is not None:
        meta = _from_log(args)
    elif args.env is None and args.world is None:
        raise ValueError("record needs --env ID, --world NAME or --from-log LOG")
    else:
        from worldstream.engine.core.registry import GAME_WORLDS
        from worldstream.engine.worlds.game.record import record

        if args.state is not None or args.keymap is not None:
            raise ValueError("--state and --keymap go with --from-log")
        if not 8 <= args.size <= 512:
            raise ValueError(f"--size must be in [8, 512], got {args.size}")
        env = args.env if args.env is not None else GAME_WORLDS[args.world]
        # a short recording is one shard of its own length, not a whole default shard
        shard_frames = min(args.shard_frames, max(args.frames, 2))
        meta = record(env, args.out, args.frames, size=args.size, seed=args.seed,
                      workers=args.workers, shard_frames=shard_frames)
    print(json.dumps({"out": str(args.out), **meta}))
    return 0
