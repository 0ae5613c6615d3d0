"""``python -m bench played_client --env ID --model-path DIR [--seconds 30] [--seeds 2]
[--browser]``: the as-played check of ``worldstream eval --played-only``, seen by a client of
the real server.

Two ``worldstream play`` processes on free ports: the learned world (``--model-path DIR``) and
the game itself (``--model sim``). For each seed (the eval's session seeds, ``PLAYED_SEED + i``)
a session is opened on each with that seed and played over the WebSocket fallback, pull by
pull from its first frame: after frame ``k`` arrives the held keys for frame ``k + 1`` are sent
(when they change), then ``next``. The keys are the eval's tapping player (``Player``, ``TAPS``,
the eval's generator) translated to wire keys through ``GET /api/controls``. The learned world
starts from the game's reset and ``context - 1`` start actions that it does not stream; the
game streams them, so its session is sent the start action for its first ``context - 1``
frames. Each frame header names the action it was conditioned on (``action_seq``): the actions
each side really played are recorded, and the game's are replayed here, in the game itself,
to check that the stream is the game (``wire_is_game``).

Frames (JPEG, scaled up by the server) are read as the mean of each world pixel's block's
middle and mapped to the nearest colour of the world's palette; the figures are
``played.figures`` of the eval (moving objects per class, class motion, births per 100
frames, the first birth away from the keys' object, found from the game states replayed here).
Not as in the eval: the player never reacts to a lost ball (the client cannot see one; it
presses FIRE every 2-5 s anyway) and no transition is left out for a game over.

``--browser``: each server's page in headless Chromium (seed set, restarted), the same keys
pressed as keyboard events at the stream's frame rate, the video's current frame read every
~0.2 s (drawn into a canvas at its own size); moving objects per class per pair of successive
reads, model against game, where a pixel whose colour moved less than ``STILL_LEVELS`` since
the read before keeps its class (VP8's noise is no object). The page's session starts before
the first key: its reads are not aligned with the reset as the WebSocket's are. Saved under
``--out`` (default ``results/played_client``).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from worldstream.engine.evaluation.game import objects as go
from worldstream.engine.evaluation.game import played

FPS = 15
#: seconds between two reads of the page's video
SHOT_EVERY_S = 0.2


# ------------------------------------------------------------------ keys and frames
def wire_keys(controls: dict, meanings: tuple[str, ...]) -> list[list[str]]:
    """Action id -> the fewest wire keys whose combo the server maps to its meaning
    (``controls``: ``GET /api/controls``). ValueError for an action no keys reach."""
    combos: dict[str, str] = {}
    for name, meaning in sorted((controls.get("actions") or {}).items(),
                                key=lambda kv: (kv[0].count("+"), kv[0])):
        combos.setdefault(meaning, name)
    missing = [m for m in meanings if m not in combos]
    if missing:
        raise ValueError(f"no keys of {controls.get('env')} reach actions {missing}")
    return [[k for k in combos[m].split("+") if k] for m in meanings]


def player_actions(meanings: tuple[str, ...], seed: int, frames: int) -> list[int]:
    """The eval's tapping player of session ``seed`` (its generator, ``TAPS``), ``frames``
    action ids (no lost ball is seen: no ``setback``)."""
    index = tuple(played.POLICIES).index("taps")
    player = played.Player(meanings, np.random.default_rng([seed, index, 72]), played.TAPS)
    return [player() for _ in range(frames)]


def world_pixels(jpeg: bytes, size: int) -> np.ndarray:
    """A streamed JPEG -> ``(size, size, 3)`` uint8: the centre pixel of each world pixel
    (the server scales up by a whole factor, nearest neighbour)."""
    from PIL import Image

    rgb = np.asarray(Image.open(io.BytesIO(jpeg)).convert("RGB"))
    return centres(rgb, size)


def centres(rgb: np.ndarray, size: int) -> np.ndarray:
    """``(H, W, 3)`` uint8 scaled up from ``(size, size)`` by a whole factor ``s`` -> each world
    pixel's colour: the mean of its block's middle half (edges carry the codec's ringing)."""
    s = rgb.shape[1] // size
    if s < 1 or rgb.shape[0] != s * size or rgb.shape[1] != s * size:
        raise ValueError(f"a {rgb.shape[1]}x{rgb.shape[0]} frame is no multiple of {size}")
    q = s // 4
    blocks = rgb.reshape(size, s, size, s, 3)[:, q:s - q, :, q:s - q].astype(np.float32)
    return np.rint(blocks.mean((1, 3))).astype(np.uint8)


#: a read's pixel within this much (any channel) of the read before keeps its colour class
STILL_LEVELS = 24


def steady(reads: np.ndarray, palette) -> np.ndarray:
    """``(n, H, W, 3)`` reads of a lossy video -> ``(n, H, W)`` palette indices where a pixel
    whose colour barely changed since the read before keeps that read's class: the codec's
    noise flipping a colour between two near palette entries is no moving object."""
    idx = palette.encode(reads)
    for t in range(1, len(reads)):
        still = (np.abs(reads[t].astype(np.int16) - reads[t - 1]) <= STILL_LEVELS).all(-1)
        idx[t] = np.where(still, idx[t - 1], idx[t])
    return idx


# ------------------------------------------------------------------ one session, WebSocket
@dataclass
class Recording:
    """One session as a client saw it: ``frames`` RGB at the world's size, the header's
    ``index`` of each, ``played`` the action id each frame was conditioned on (its
    ``action_seq``; the idle action before any), ``errors`` the server's error messages."""

    frames: list[np.ndarray] = field(default_factory=list)
    index: list[int] = field(default_factory=list)
    played: list[int] = field(default_factory=list)
    errors: list[dict] = field(default_factory=list)
    wall_s: float = 0.0
    restarts: int = 0
    """Sessions closed before this one for not starting at the reset (``record``)."""


async def record(url: str, seed: int, script: list[int], keys: list[list[str]],
                 size: int | None = None, fps: int = FPS, timeout_s: float = 120.0,
                 tries: int = 4) -> Recording:
    """Play ``script`` (an action id per frame; ``keys``: each action's wire keys) in a new
    session of ``seed`` at ``url``; frames sampled at ``size`` (default: the session's).

    NOTE: the server hands out the newest due frame (latest wins): frames due before the
    client's first ``next`` is read are dropped, so on a loaded machine a session may begin at
    frame 1 or 2. A session whose first frame is not the first (index 0) is closed and opened
    again, at most ``tries`` times (``Recording.restarts``); ``CREDITS`` frames are asked for
    ahead, so a late read later on drops nothing."""
    for attempt in range(tries):
        out = await _session(url, seed, script, keys, size, fps, timeout_s)
        out.restarts = attempt
        if out.index[:1] == [0] or attempt == tries - 1:
            return out
    raise AssertionError("unreachable")


#: ``next`` credits kept in flight (the server banks up to 4)
CREDITS = 2


async def _session(url, seed, script, keys, size, fps, timeout_s) -> Recording:
    import httpx
    import websockets

    from worldstream.streaming.websocket import unpack_frame

    idle = next((a for a, k in enumerate(keys) if not k), 0)
    out, by_seq = Recording(), {}
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        reply = await http.post("/api/sessions", json={"prompt": "", "seed": seed, "fps": fps})
        if reply.status_code != 201:
            raise RuntimeError(f"POST /api/sessions: {reply.status_code} {reply.text}")
        session = reply.json()
        sid, token = session["session_id"], session["token"]
        size = size or int(session["width"])
        ws_url = "ws" + url[len("http"):] + f"/api/sessions/{sid}/ws?token={token}"
        t0 = time.monotonic()
        try:
            async with websockets.connect(ws_url, max_size=None) as ws:
                held: list[str] | None = None

                async def hold(action: int) -> None:
                    nonlocal held
                    if keys[action] != held:
                        held = keys[action]
                        seq = len(by_seq) + 1
                        by_seq[seq] = action
                        await ws.send(json.dumps({"type": "action", "seq": seq,
                                                  "t": time.monotonic() * 1e3, "keys": held}))

                await hold(script[0])
                for _ in range(CREDITS):
                    await ws.send('{"type": "next"}')
                while len(out.index) < len(script):
                    message = await asyncio.wait_for(ws.recv(), timeout_s)
                    if isinstance(message, str):
                        parsed = json.loads(message)
                        if parsed.get("type") == "error":
                            out.errors.append(parsed)
                        continue
                    header, jpeg = unpack_frame(message)
                    k = len(out.index) + 1
                    if k < len(script):  # before decoding: in time for frame k
                        await hold(script[k])
                    if k + CREDITS <= len(script):
                        await ws.send('{"type": "next"}')
                    out.index.append(int(header["index"]))
                    if out.index[0] != 0:
                        break  # not from the reset: see record's NOTE
                    out.played.append(by_seq.get(int(header.get("action_seq", -1)), idle))
                    out.frames.append(world_pixels(jpeg, size))
        finally:
            out.wall_s = time.monotonic() - t0
            await http.delete(f"/api/sessions/{sid}",
                              headers={"Authorization": f"Bearer {token}"})
    return out


def replay_game(env: str, size: int, seed: int, actions: list[int], every: int):
    """The game itself in this process from the session's reset, stepped by ``actions`` (a
    game over resets, as the server's game does): its frames after each action and a snapshot
    every ``every`` frames (for the keys' object)."""
    from worldstream.engine.backends.game.sim import episode_seed
    from worldstream.engine.worlds.game.env import GameEnv

    game = GameEnv(env, size=size)
    try:
        game.reset(episode_seed(seed, 0))
        frames, snaps, episode = [], [], 0
        for t, action in enumerate(actions):
            if t % every == every // 2 and not game.done:
                snaps.append(game.snapshot())
            if game.done:
                episode += 1
                frames.append(game.reset(episode_seed(seed, episode)))
            else:
                frames.append(game.step(action))
        return np.stack(frames), snaps
    finally:
        game.close()


# ------------------------------------------------------------------ the figures
def judge(model: list[np.ndarray], game: list[np.ndarray], palette, context: int,
          seeds: list[int], fps: int, seconds: float, control=None
          ) -> tuple[dict, played.Plays]:
    """``played.figures`` of the sessions: ``model[i]``, ``game[i]`` ``(T_i, H, W)`` palette
    indices of seed ``i``, both starting at the game's frames after its first start action
    (the first ``context - 1`` are start frames); cut to the shortest."""
    n = min(min(len(m) for m in model), min(len(g) for g in game))
    plays = played.Plays(np.stack([m[:n] for m in model]), np.stack([g[:n] for g in game]),
                         np.ones((len(seeds), n - 1), bool), np.zeros((len(seeds), n - 1)),
                         np.asarray(seeds), max(context - 2, 0), [])
    band = np.zeros(plays.game.shape[2:], bool)
    out = played.figures(plays, control, band, fps, seconds, len(palette))
    return {k: v for k, v in out.items() if "cleared" not in k}, plays


def as_eval_game(env: str, size: int, seed: int, frames: int, context: int, palette,
                 streamed: np.ndarray, played_actions: list[int]) -> dict:
    """How long the game's stream (palette indices and the actions its frames answered, from
    its first step) is the eval's own game side of session ``seed`` (``played.play_game``):
    seconds of identical frames from the start, of identical actions from the first played
    frame (after the ``context - 1`` start frames). The eval's player
    also reacts to lost balls, which draws from its generator: its actions part from the
    client's there, and its frames with them."""
    from worldstream.engine.worlds.game.env import GameEnv

    game = GameEnv(env, size=size)
    try:
        shown, actions = played.play_game(game, seed, played.TAPS, frames, context,
                                          tuple(played.POLICIES).index("taps"))[:2]
    finally:
        game.close()
    ref = palette.encode(np.stack(shown[1:]))  # the reset frame is not streamed

    def same_for(a, b) -> float:
        k = min(len(a), len(b))
        differ = np.flatnonzero([not np.array_equal(x, y) for x, y in zip(a[:k], b[:k])])
        return round(float(differ[0] if len(differ) else k) / FPS, 2)

    start = context - 1  # the start race delays a start action, not the player's
    return {"frames_same_s": same_for(ref, streamed),
            "actions_same_s": same_for(actions[start:], played_actions[start:])}


def keys_object(env: str, palette, plays, snaps: list):
    """The keys' object (``played.find_controlled``) from game states of the replays."""
    from worldstream.engine.worlds.game.env import GameEnv

    game = GameEnv(env, size=plays.game.shape[-1])
    try:
        return played.find_controlled(SimpleNamespace(palette=palette), game,
                                      replace(plays, snapshots=snaps))
    finally:
        game.close()


def per_class(shots: np.ndarray, colours: int) -> np.ndarray:
    """Moving objects per colour class per pair of successive reads ``(n, H, W)``."""
    if len(shots) < 2:
        return np.zeros(colours)
    objects = go.moving_objects(shots[:-1], shots[1:])
    return np.bincount(objects.colour, minlength=colours) / (len(shots) - 1)


# ------------------------------------------------------------------ the page
RECEIVER = """() => new Promise((done) => window.worldstream.pc.getStats().then((all) => {
  const out = {}; all.forEach((s) => { if (s.type === "inbound-rtp" && s.kind === "video")
    { out.framesDecoded = s.framesDecoded; out.framesDropped = s.framesDropped; } });
  done(out); }))"""
GRAB = """() => { const v = document.getElementById('ws-video');
  const c = document.createElement('canvas'); c.width = v.videoWidth; c.height = v.videoHeight;
  c.getContext('2d').drawImage(v, 0, 0); return c.toDataURL('image/png'); }"""


def browse(url: str, seed: int, script: list[int], keys: list[list[str]], codes: dict,
           size: int, fps: int = FPS) -> dict:
    """Press ``script`` on the page at ``url`` (a session of ``seed``) at ``fps``; the video's
    frame every ``SHOT_EVERY_S`` (``(n, size, size, 3)``) and how fast the page played."""
    from PIL import Image
    from playwright.sync_api import sync_playwright

    from worldstream.bench.browser import ARGS, CHROMIUM

    shots, times = [], []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(url, wait_until="domcontentloaded")
            ready = ("document.getElementById('ws-badge')?.dataset.kind === 'webrtc' && "
                     "document.getElementById('ws-video').videoWidth > 0")
            page.wait_for_function(ready, timeout=120_000)
            old = page.evaluate("window.worldstream.session.token")
            page.fill("#ws-seed", str(seed))
            page.click("#ws-restart")
            page.wait_for_function(f"window.worldstream.session && window.worldstream.session"
                                   f".token !== {json.dumps(old)} && {ready}", timeout=120_000)
            before = page.evaluate(RECEIVER)
            held: set[str] = set()
            start = time.monotonic()
            next_shot = start
            for k, action in enumerate(script):
                want = {codes[w] for w in keys[action]}
                for code in sorted(held - want):
                    page.keyboard.up(code)
                for code in sorted(want - held):
                    page.keyboard.down(code)
                held = want
                now = time.monotonic()
                if now >= next_shot:
                    data = page.evaluate(GRAB).split(",", 1)[1]
                    rgb = np.asarray(Image.open(io.BytesIO(base64.b64decode(data)))
                                     .convert("RGB"))
                    shots.append(centres(rgb, size))
                    times.append(time.monotonic() - start)
                    next_shot = max(next_shot + SHOT_EVERY_S, now)
                pause = start + (k + 1) / fps - time.monotonic()
                if pause > 0:
                    page.wait_for_timeout(1e3 * pause)
            elapsed = time.monotonic() - start
            after = page.evaluate(RECEIVER)
            hud_fps = page.inner_text("#hud-fps")
        finally:
            browser.close()
    decoded = (after.get("framesDecoded") or 0) - (before.get("framesDecoded") or 0)
    return {"shots": np.stack(shots), "times_s": times, "elapsed_s": elapsed,
            "decoded_fps": decoded / elapsed, "hud_fps": hud_fps,
            "late_s": elapsed - len(script) / fps}


# ------------------------------------------------------------------ the run
def _ratios(m: np.ndarray, g: np.ndarray, classes) -> tuple[dict, float]:
    per = {str(k): [round(float(m[k]), 4), round(float(g[k]), 4)] for k in classes}
    return per, played.worst([float(m[k] / g[k]) if g[k] > 0 else float("nan")
                              for k in classes])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench played_client", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", required=True)
    parser.add_argument("--model-path", required=True, metavar="DIR")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--browser", action="store_true")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of each server")
    parser.add_argument("--out", default="results/played_client")
    args = parser.parse_args(argv)

    import httpx

    from worldstream.bench.adversarial import PlayServer
    from worldstream.bench.browser import GamePlayServer
    from worldstream.engine.evaluation.game.sheet import save_played_sheet
    from worldstream.engine.models.game.world import load_world
    from worldstream.engine.worlds.game.env import GameEnv

    world = load_world(args.model_path, env_id=args.env)
    palette, c, size = world.palette, world.context, world.size
    meanings = tuple(world.action_meanings)
    probe = GameEnv(args.env, size=size)
    start_action = played._start_action(probe)
    probe.close()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    n = int(round(args.seconds * FPS))
    seeds = [int(s) for s in played.session_seeds(played.PlayedConfig(seeds=args.seeds))]
    report: dict = {"env": args.env, "model_path": args.model_path, "seconds": args.seconds,
                    "seeds": seeds, "fps": FPS, "context": c, "sessions": []}
    with GamePlayServer(args.env, args.model_path, args.threads) as model_srv, \
            PlayServer("sim", 1, args.threads, ["--env", args.env]) as game_srv:
        # NOTE: each server's own key map (a world folder's keymap.json may name other keys
        # than the game's derived one: Pong's paddle is left/right in one, up/down in the
        # other); the same action ids are pressed on both
        controls = {side: httpx.get(f"{srv.url}/api/controls", timeout=10).json()
                    for side, srv in (("model", model_srv), ("game", game_srv))}
        keys = {side: wire_keys(c, meanings) for side, c in controls.items()}
        report["keys"] = keys
        models, games, snaps, scripts = [], [], [], []
        for seed in seeds:
            acts = player_actions(meanings, seed, n)
            game_script = [start_action] * (c - 1) + acts
            m, g = asyncio.run(_both(model_srv.url, game_srv.url, seed, acts, game_script,
                                     keys, size))
            replayed, s = replay_game(args.env, size, seed, g.played, max(1, n // 16))
            g_idx, m_idx = palette.encode(np.stack(g.frames)), palette.encode(np.stack(m.frames))
            models.append(np.concatenate([g_idx[:c - 1], m_idx]))
            games.append(g_idx)
            snaps += s
            scripts.append((acts, game_script))
            report["sessions"].append({
                "seed": seed, "model_frames": len(m.frames), "game_frames": len(g.frames),
                "model_wall_s": round(m.wall_s, 2), "game_wall_s": round(g.wall_s, 2),
                "index_gaps": [int((np.diff(r.index) != 1).sum()) for r in (m, g)],
                "first_index": [r.index[0] for r in (m, g)],
                "restarts": [r.restarts for r in (m, g)],
                "played_as_scripted": [float(np.mean(np.array(r.played) == np.array(sc)))
                                       for r, sc in ((m, acts), (g, game_script))],
                "played_same": float(np.mean(np.array(m.played) == np.array(g.played[c - 1:]))),
                "wire_is_game": float((palette.encode(replayed) == g_idx).mean()),
                "as_eval_game": as_eval_game(args.env, size, seed, n, c, palette, g_idx,
                                             g.played),
                "errors": m.errors + g.errors})
            save_played_sheet(palette.decode(models[-1]), palette.decode(games[-1]),
                              out_dir / f"sheet_ws_{seed}.png",
                              f"{args.env} seed {seed}: model (top) over game, WebSocket",
                              FPS, max(c - 2, 0))
        figures, plays = judge(models, games, palette, c, seeds, FPS, args.seconds)
        control = keys_object(args.env, palette, plays, snaps)
        if control is not None:
            figures, _ = judge(models, games, palette, c, seeds, FPS, args.seconds, control)
        report["websocket"] = figures
        if args.browser:
            report["browser"] = _browser(model_srv.url, game_srv.url, seeds, scripts, keys,
                                         controls, size, palette, figures, out_dir)
    (out_dir / "result.json").write_text(json.dumps(report, indent=1, default=float) + "\n")
    print(json.dumps({k: v for k, v in report.items() if k != "sessions"}, default=float,
                     indent=1))
    print(f"report: {out_dir / 'result.json'}", file=sys.stderr)
    return 0


async def _both(model_url, game_url, seed, acts, game_script, keys, size):
    return await asyncio.gather(record(model_url, seed, acts, keys["model"], size),
                                record(game_url, seed, game_script, keys["game"], size))


def _browser(model_url, game_url, seeds, scripts, keys, controls, size, palette, figures,
             out_dir):
    """The page of each server per seed, one after the other; per-class objects per pair of
    reads, model against game, over the seeds."""
    from worldstream.engine.evaluation.game.sheet import save_played_sheet

    codes: dict[str, dict[str, str]] = {side: {} for side in controls}
    for side, c in controls.items():
        for code, wire in sorted(c["keys"].items()):
            codes[side].setdefault(wire, code)
    colours = len(palette)
    counts = {"model": np.zeros(colours), "game": np.zeros(colours)}
    pages = []
    for seed, (acts, game_script) in zip(seeds, scripts, strict=True):
        got = {}
        for side, url, script in (("model", model_url, acts), ("game", game_url, game_script)):
            got[side] = browse(url, seed, script, keys[side], codes[side], size)
            got[side]["steady"] = steady(got[side]["shots"], palette)
            counts[side] += per_class(got[side]["steady"], colours)
        k = min(len(got["model"]["shots"]), len(got["game"]["shots"]))
        save_played_sheet(palette.decode(got["model"]["steady"][:k]),
                          palette.decode(got["game"]["steady"][:k]),
                          out_dir / f"sheet_browser_{seed}.png",
                          f"seed {seed}: model (top) over game, the page's video every "
                          f"{SHOT_EVERY_S} s", round(1 / SHOT_EVERY_S))
        pages.append({"seed": seed, **{f"{side}_{key}": (round(v, 2) if isinstance(v, float)
                                                         else v)
                                       for side in got for key, v in got[side].items()
                                       if key not in ("shots", "steady", "times_s")},
                      "reads": [len(got[s]["shots"]) for s in ("model", "game")]})
    classes = [int(k) for k in figures["played_objects_per_class"]]
    per, worst = _ratios(counts["model"] / len(seeds), counts["game"] / len(seeds), classes)
    slow = [p for p in pages if min(p["model_decoded_fps"], p["game_decoded_fps"]) < 0.9 * FPS]
    return {"objects_per_pair_per_class": per, "objects_ratio": worst, "pages": pages,
            "slower_than_real_time": bool(slow)}
