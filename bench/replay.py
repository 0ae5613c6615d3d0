"""``python -m bench replay``: exact replay of a live session.

A session is steered live through the engine for ``--seconds`` at its real-time pace: a key
change every 2 s, three prompt switches (at 1/4, 1/2 and 3/4 of the run, one a blend), a fork
of two futures adopted once its previews arrive (at 1/3), a rewind (at 2/3). Its input log is
exported and replayed headless on the same backend; every frame of the original stream is
compared with the replay's, byte for byte. Prints one JSON line: frames, identical frames,
events by kind, the wall time of the live run and of the replay, torch threads.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

KEYS = (["right"], ["down", "right"], ["down"], [], ["left"], ["up", "left"], ["up"], [])
PROMPTS = ("a snowy forest", "hot desert dunes", "a dark landscape at night")


def main(argv: list[str] | None = None) -> int:
    import torch

    from worldstream.engine.core.api import (
        ActionCommand,
        AdoptCommand,
        ForkCommand,
        PromptCommand,
        RewindCommand,
    )
    from worldstream.engine.core.config import EngineConfig
    from worldstream.engine.core.engine import Engine
    from worldstream.engine.core.inputlog import parse_log
    from worldstream.engine.core.registry import load_backend
    from worldstream.engine.studio import worldio
    from worldstream.engine.studio.replay import replay

    p = argparse.ArgumentParser(prog="python -m bench replay", description=__doc__)
    p.add_argument("--seconds", type=float, default=60.0, help="length of the live session")
    p.add_argument("--model", default="builtin", help="builtin | sim")
    p.add_argument("--fps", type=int, default=None, help="session fps (default: the model's)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--log", default=None, help="also write the exported input log here")
    args = p.parse_args(argv)

    backend = load_backend(args.model)
    config = EngineConfig(max_sessions=2, fps=args.fps, mode="responsive")
    frames, kinds = [], {}
    t0 = time.perf_counter()
    with Engine(backend, config) as engine:
        sid = engine.create_session("a green meadow with ponds", seed=args.seed).session_id
        slot = engine.subscribe(sid, maxlen=1_000_000)
        events = engine.events(sid)
        fps = engine.default_fps if args.fps is None else args.fps
        total = int(args.seconds * fps)
        plan = [(int(i * 2 * fps), ActionCommand(0, 0.0, frozenset(KEYS[i % len(KEYS)])))
                for i in range(int(args.seconds // 2))]
        plan += [(total // 4, PromptCommand(0, 0.0, PROMPTS[0])),
                 (total // 2, PromptCommand(0, 0.0, PROMPTS[1], PROMPTS[0], 0.3)),
                 (3 * total // 4, PromptCommand(0, 0.0, PROMPTS[2])),
                 (total // 3, ForkCommand(0, 2)), (2 * total // 3, RewindCommand(0, 3))]
        plan.sort(key=lambda item: item[0])
        seq, fork_pending = 0, False
        while len(frames) < total:
            frame = slot.get(timeout=1.0)
            if frame is not None:
                frames.append(frame.rgb)
            while plan and plan[0][0] <= len(frames):
                seq += 1
                command = plan.pop(0)[1]
                fields = {**command.__dict__, "seq": seq}
                engine.submit(sid, type(command)(**fields))
                fork_pending = fork_pending or isinstance(command, ForkCommand)
            while not events.empty():
                event = events.get_nowait()
                if event.kind == "preview" and fork_pending:
                    seq += 1
                    engine.submit(sid, AdoptCommand(seq, 1))
                    fork_pending = False
                elif event.kind == "error":
                    raise RuntimeError(f"the session refused a command: {event.payload}")
        log = worldio.export_log(engine, sid).result(timeout=120)
        while len(frames) < log["frames"]:
            frames.append(slot.get(timeout=10.0).rgb)
        engine.close_session(sid)
    live_s = time.perf_counter() - t0
    if args.log:
        with open(args.log, "w") as f:
            json.dump(log, f)
    for e in log["events"]:
        kinds[e["kind"]] = kinds.get(e["kind"], 0) + 1
    replayed: list[np.ndarray] = []
    t1 = time.perf_counter()
    replay(backend, parse_log(json.dumps(log)), replayed.append)
    replay_s = time.perf_counter() - t1
    got = np.concatenate(replayed)
    original = np.stack(frames[:log["frames"]])
    same = sum(np.array_equal(a, b) for a, b in zip(got, original))
    print(json.dumps({
        "model": args.model, "seconds": round(log["frames"] / log["fps"], 1),
        "frames": int(log["frames"]), "identical_frames": int(same),
        "identical_fraction": round(same / max(len(original), 1), 4),
        "replay_frames": int(len(got)), "events": kinds, "live_wall_s": round(live_s, 1),
        "replay_wall_s": round(replay_s, 1), "torch_threads": torch.get_num_threads(),
    }))
    return 0 if same == len(original) == len(got) else 1
