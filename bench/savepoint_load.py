"""``python -m bench savepoint <memory|fps> [args]``: what loading a save point costs a real
``worldstream play`` server (a process of its own, loopback).

- ``memory`` (``--env ALE/Pong-v5``): the longest honest save of the game (every snapshot's
  episode at the game's episode limit: Pong's 27,000 actions in each of 17 snapshots, its
  emulator state and frame the server's own) loaded into a session; the server's resident
  memory (``/proc/PID/status`` VmRSS) before, after the load and after three more loads, and
  whether the session's next save loads. Goal: growth <= 2x the file, flat over the reloads.
- ``fps`` (``--env CrafterReward-v1``): one session streamed over its WebSocket (two ``next``
  credits in flight, each arriving frame noted) while a second session loads a long honest
  crafter save again and again (no emulator state in the file: each load replays the episode
  off the engine thread); the streamed session's fps in ``--window`` s windows alone
  (``--alone`` s before the loads) and while a load is in flight, same run. Goal: >= 90 %.

Prints one JSON object (and writes it to ``--out`` when given).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from pathlib import Path

import numpy as np

from worldstream.bench.adversarial import PlayServer, server_rss_mib

#: steps before the end of the longest episode found at which the crafter save is made
END_MARGIN = 100


def _auth(created: dict) -> dict:
    return {"Authorization": f"Bearer {created['token']}"}


def _load_headers(created: dict) -> dict:
    return {**_auth(created), "Content-Type": "application/octet-stream"}


# ---------------------------------------------------------------- memory (a native-state game)
def longest_save(raw: bytes, max_actions: int, history: int) -> bytes:
    """The server's own save ``raw`` grown to the longest honest one: ``now`` at the episode
    limit and ``history`` snapshots before it (one action apart, as chunks of one frame), each
    with the saved emulator state and frame (the sizes a server writes after a full episode).
    ``max_actions``: the game's episode limit (``GameEnv.max_episode_steps``)."""
    from safetensors.numpy import load

    from worldstream.engine.studio import savepoint

    arrays, meta = load(raw), savepoint.read_meta(raw)
    now = meta["state"]["now"]
    grown = {"now.frame": arrays["now.frame"], "now.native": arrays["now.native"],
             "now.actions": np.ones(max_actions, np.int32)}
    for i in range(history):
        grown[f"history.{i}.frame"] = arrays["now.frame"]
        grown[f"history.{i}.native"] = arrays["now.native"]
        grown[f"history.{i}.actions"] = np.ones(max_actions - (history - i), np.int32)
    meta["state"]["history"] = [dict(now, done=False) for _ in range(history)]
    return savepoint.encode(grown, meta)


def memory(url: str, pid: int, env: str, history: int, settle_s: float) -> dict:
    import httpx

    from worldstream.engine.worlds.game.env import GameEnv

    game = GameEnv(env, size=16)
    max_actions = game.max_episode_steps
    game.close()

    def rss() -> float:
        time.sleep(settle_s)
        return round(server_rss_mib(pid), 2)

    with httpx.Client(base_url=url, timeout=120) as http:
        s = http.post("/api/sessions", json={"prompt": "play"}).json()
        url_state = f"/api/sessions/{s['session_id']}/state"
        small = http.get(url_state, headers=_auth(s)).content
        # NOTE: one load of the server's own small save first: imports and first-use
        # allocations of the load path are not the file's cost
        assert http.post(url_state, content=small, headers=_load_headers(s)).status_code == 200
        big = longest_save(small, max_actions, history)
        before = rss()
        loads = []
        for _ in range(4):
            r = http.post(url_state, content=big, headers=_load_headers(s))
            if r.status_code != 200:
                raise RuntimeError(f"the longest save was refused: {r.status_code} {r.text}")
            loads.append(rss())
        again = http.get(url_state, headers=_auth(s)).content
        reload = http.post(url_state, content=again, headers=_load_headers(s)).status_code
    mib = len(big) / 2**20
    return {"file_bytes": len(big), "file_mib": round(mib, 3), "rss_before_mib": before,
            "rss_after_each_load_mib": loads,
            "growth_mib": round(loads[0] - before, 2),
            "growth_x_file": round((loads[0] - before) / mib, 3),
            "growth_after_4_loads_x_file": round((loads[-1] - before) / mib, 3),
            "next_save_bytes": len(again), "next_save_load_status": reload}


# ---------------------------------------------------------------- fps (a replayed game)
def long_crafter_save(raw: bytes, env: str, seeds: int, min_steps: int) -> tuple[bytes, int]:
    """A long honest save of a game without emulator state, built like the server's: the
    server's save ``raw`` gives the file's session and version; the state is the episode,
    among session seeds ``0..seeds-1`` (held-key player, :mod:`engine.worlds.game.policy`),
    that lasts longest (stopping at the first of ``min_steps``), END_MARGIN steps before its
    end, played by the same backend code with the server's defaults and exported as the
    server does. Returns (file, steps replayed by a load)."""
    from worldstream.engine.backends.game.sim import GameEnvBackend, episode_seed
    from worldstream.engine.core.backend import ChunkJob
    from worldstream.engine.studio import savepoint
    from worldstream.engine.studio.savestate import export_state
    from worldstream.engine.worlds.game.env import GameEnv
    from worldstream.engine.worlds.game.policy import HeldKeyPolicy

    meta = savepoint.read_meta(raw)
    size = int(meta.get("session", {}).get("chunk_frames", 1))
    game = GameEnv(env, size=16)
    best = (0, 0)
    for seed in range(seeds):
        game.reset(episode_seed(seed, 0))
        player = HeldKeyPolicy(tuple(game.action_meanings), np.random.default_rng(seed))
        n = 0
        while not game.done and n < game.max_episode_steps - 1:
            game.step(player())
            n += 1
        best = max(best, (n, seed))
        if n >= min_steps:
            break
    game.close()
    # NOTE: saved well before the episode's end (the player dies there): the next episode's
    # world generation (crafter: ~1 s of pure Python on the engine thread) would follow each
    # load and stall every session, a cost of the game's episode start, not of the load
    steps, seed = max(1, best[0] - END_MARGIN), best[1]
    backend = GameEnvBackend(env=env)
    state = backend.new_state("play", seed)
    player = HeldKeyPolicy(tuple(backend.action_meanings), np.random.default_rng(seed))
    actions = [player() for _ in range(steps)]
    tail = backend.rewind_chunks * size
    for a in actions[:-tail]:
        backend.step(state, a)
    for i in range(len(actions) - tail, len(actions), size):
        backend.generate([ChunkJob(state, actions[i:i + size], 1)])
    arrays, scalars = export_state(backend, state)
    backend.free(state)
    backend.close()
    meta["session"]["seed"] = seed
    meta["state"] = scalars
    return savepoint.encode(arrays, meta), steps


async def fps(url: str, env: str, seconds: float, alone: float, window: float, seeds: int,
              min_steps: int) -> dict:
    import httpx
    import websockets

    async with httpx.AsyncClient(base_url=url, timeout=120) as http:
        probe = (await http.post("/api/sessions", json={"prompt": "play"})).json()
        raw = (await http.get(f"/api/sessions/{probe['session_id']}/state",
                              headers=_auth(probe))).content
        await http.delete(f"/api/sessions/{probe['session_id']}", headers=_auth(probe))
        save, steps = await asyncio.to_thread(long_crafter_save, raw, env, seeds, min_steps)
        # the sessions made once the save is (an unwatched session times out)
        loader = (await http.post("/api/sessions", json={"prompt": "play"})).json()
        viewer = (await http.post("/api/sessions", json={"prompt": "play"})).json()
        url_state = f"/api/sessions/{loader['session_id']}/state"
        arrivals: list[float] = []
        loads: list[tuple[float, float, int]] = []
        ws_url = url.replace("http", "ws", 1) + \
            f"/api/sessions/{viewer['session_id']}/ws?token={viewer['token']}"
        loader_url = url.replace("http", "ws", 1) + \
            f"/api/sessions/{loader['session_id']}/ws?token={loader['token']}"
        async with websockets.connect(ws_url, max_size=None) as ws, \
                websockets.connect(loader_url, max_size=None) as loader_ws:
            async def view(socket, arrived: list[float]) -> None:
                for _ in range(2):
                    await socket.send('{"type":"next"}')
                while True:
                    if isinstance(await socket.recv(), bytes):
                        arrived.append(time.monotonic())
                        await socket.send('{"type":"next"}')

            # NOTE: the loading session streams too (a session with no open transport is
            # closed after a grace): the reference is two sessions streaming, same as during
            tasks = [asyncio.ensure_future(view(ws, arrivals)),
                     asyncio.ensure_future(view(loader_ws, []))]
            await asyncio.sleep(3.0)  # the stream settles
            start = time.monotonic()
            await asyncio.sleep(alone)
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                t0 = time.monotonic()
                r = await http.post(url_state, content=save, headers=_load_headers(loader))
                loads.append((t0, time.monotonic(), r.status_code))
            await asyncio.sleep(0.5)
            for task in tasks:
                task.cancel()
    loading = [(a, b) for a, b, status in loads if status == 200]

    def rate(t0: float, t1: float) -> float:
        return sum(t0 <= t < t1 for t in arrivals) / (t1 - t0)

    alone_w = [rate(t, t + window) for t in np.arange(start, start + alone - window + 1e-9,
                                                        window)]
    during_w = [rate(t, t + window) for a, b in loading
                for t in np.arange(a, b - window + 1e-9, window)]
    # all load time together (a load may be shorter than a window)
    total = sum(b - a for a, b in loading)
    frames = sum(any(a <= t < b for a, b in loading) for t in arrivals)
    ref = rate(start, start + alone)
    during = frames / total if total else float("nan")
    # per load: the streamed session's longest wait between frames and when it began
    stalls = []
    for a, b in loading:
        inside = [t for t in arrivals if a - 0.5 <= t < b + 0.5]
        if len(inside) > 1:
            gaps = np.diff(inside)
            i = int(np.argmax(gaps))
            stalls.append((round(float(gaps[i]), 3), round(inside[i] - a, 3), round(b - a, 3)))
    return {"save_bytes": len(save), "replay_steps": steps,
            "stalls_s_from_load_start_of_load_s": stalls,
            "loads": len(loads), "load_status": sorted({c for *_, c in loads}),
            "load_s_mean": round(total / max(1, len(loading)), 3),
            "fps_alone": round(ref, 2), "fps_during_loads": round(during, 2),
            "ratio_during_over_alone": round(during / ref, 3),
            "fps_alone_windows": [round(x, 1) for x in alone_w],
            "fps_during_windows": [round(x, 1) for x in during_w],
            "loadavg": [round(x, 2) for x in os.getloadavg()]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench savepoint",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("measure", choices=("memory", "fps"))
    parser.add_argument("--env", default=None,
                        help="the game (default: ALE/Pong-v5 for memory, CrafterReward-v1 "
                             "for fps)")
    parser.add_argument("--history", type=int, default=16,
                        help="memory: rewind snapshots in the save (the server's default 16)")
    parser.add_argument("--settle", type=float, default=2.0,
                        help="memory: seconds after each load before reading RSS")
    parser.add_argument("--seconds", type=float, default=30.0, help="fps: seconds of loads")
    parser.add_argument("--alone", type=float, default=15.0,
                        help="fps: seconds streamed alone first")
    parser.add_argument("--window", type=float, default=1.0, help="fps: window, s")
    parser.add_argument("--seeds", type=int, default=12,
                        help="fps: session seeds tried for the longest episode")
    parser.add_argument("--min-steps", type=int, default=2000,
                        help="fps: stop the search at an episode this long")
    parser.add_argument("--threads", type=int, default=1, help="the server's OMP threads")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    env = args.env or ("ALE/Pong-v5" if args.measure == "memory" else "CrafterReward-v1")
    with PlayServer(None, 4, args.threads, extra=["--env", env]) as server:
        if args.measure == "memory":
            result = memory(server.url, server.proc.pid, env, args.history, args.settle)
        else:
            result = asyncio.run(fps(server.url, env, args.seconds, args.alone, args.window,
                                     args.seeds, args.min_steps))
    result = {"measure": args.measure, "env": env, **result}
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0
