"""``python -m bench browser [--model builtin] [--mode responsive] [--seconds 20]``: the
action-to-photon latency a user sees in the page's HUD.

``worldstream play`` runs in a process of its own; Debian's Chromium (headless, Playwright with
``executable_path``) opens the page, waits for the WebRTC video, then presses and releases
arrow keys (a key change every 0.4-0.9 s, seeded) for ``--seconds``. Reported: the HUD's
action-to-photon p50/p95 (measured by the page: key event -> the first displayed video frame
whose metadata carries the action), the fps it shows, the mode, and the load of the machine.
Chromium decodes and draws on the same cores as the server, so on a 2-core machine this is the
number a user of one laptop would see.

``--env ID [--model-path DIR]``: a game's learned world (``play --env ID``); the keys pressed
are the game's own (one browser key per key of its map, read from ``/api/controls``); saved
under ``results/browser_game/``.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

from worldstream.bench.adversarial import PlayServer

CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
KEYS = ["ArrowLeft", "ArrowRight", "ArrowUp", "ArrowDown"]
# the browser's own counts of the video it got (WebRTC ``inbound-rtp``): frames received,
# decoded, dropped before display, its fps estimate, the bytes of video payload, the size of
# the decoded frames and the decoder's time, s
RECEIVER_STATS = """async () => {
  const out = {};
  (await window.worldstream.pc.getStats()).forEach((s) => {
    if (s.type === "inbound-rtp" && s.kind === "video") {
      for (const k of ["framesReceived", "framesDecoded", "framesDropped", "framesPerSecond",
                       "bytesReceived", "frameWidth", "frameHeight", "totalDecodeTime"]) {
        out[k] = s[k];
      }
    }
  });
  return out;
}"""


def game_keys(url: str) -> list[str]:
    """The browser keys to press in a game world: one ``KeyboardEvent.code`` per wire key of
    its key map (``GET /api/controls``; the first listed: an arrow or Space before WASD)."""
    import httpx

    controls = httpx.get(f"{url}/api/controls", timeout=10).json()
    codes: dict[str, str] = {}
    for code, wire in (controls.get("keys") or {}).items():
        codes.setdefault(wire, code)
    if not codes:
        raise RuntimeError(f"the server at {url} lists no game keys ({controls})")
    return sorted(codes.values())


class GamePlayServer(PlayServer):
    """``worldstream play --env ID [--model-path DIR]`` in a subprocess on a free loopback port
    (:class:`bench.adversarial.PlayServer` with the game's arguments)."""

    def __init__(self, env: str, model_path: str | None, threads: int):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        environ = {**os.environ, "OMP_NUM_THREADS": str(threads),
                   "GRADIO_ANALYTICS_ENABLED": "False"}
        model = ["--model-path", model_path] if model_path else ["--model", "builtin"]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "worldstream.app.cli", "play", "--env", env, *model,
             "--port", str(self.port), "--max-sessions", "1"], env=environ)


def run(url: str, mode: str, seconds: float, seed: int = 0,
        keys: list[str] | None = None, screenshot: str | None = None) -> dict:
    """Press ``keys`` (browser codes; default the arrows) in the page at ``url``; the HUD's
    figures, the receiver's counts, the video's bandwidth over the pressing (bytes/s of RTP
    payload, ``video_bytes_per_s``) and the engine's view of the session. ``screenshot``: a
    PNG of the page saved there at the end."""
    from playwright.sync_api import sync_playwright

    keys = keys or KEYS
    rng = random.Random(seed)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(url, wait_until="domcontentloaded")
            page.wait_for_function(
                "document.getElementById('ws-badge')?.dataset.kind === 'webrtc'", timeout=120_000)
            page.wait_for_function("document.getElementById('ws-video').videoWidth > 0")
            if mode != "responsive":
                page.select_option("#ws-mode", mode)
            page.wait_for_timeout(2000)
            start_bytes = page.evaluate(RECEIVER_STATS).get("bytesReceived")
            start = time.monotonic()
            end = start + seconds
            presses = 0
            while time.monotonic() < end:
                key = rng.choice(keys)
                page.keyboard.down(key)
                page.wait_for_timeout(rng.randint(400, 900))
                page.keyboard.up(key)
                page.wait_for_timeout(rng.randint(100, 400))
                presses += 2
            a2p = [int(x) for x in re.findall(r"\d+", page.inner_text("#hud-a2p"))]
            hud = {name: page.inner_text(f"#{name}") for name in ("hud-fps", "hud-mode", "hud-jb")
                   if page.query_selector(f"#{name}")}
            receiver = page.evaluate(RECEIVER_STATS)
            elapsed = time.monotonic() - start
            if screenshot:
                page.screenshot(path=screenshot)
            server = _server_view(url, page.evaluate("window.worldstream.session.token"))
        finally:
            browser.close()
    video_bytes_per_s = None
    if start_bytes is not None and receiver.get("bytesReceived") is not None:
        video_bytes_per_s = round((receiver["bytesReceived"] - start_bytes) / elapsed)
    return {"a2p_p50_ms": a2p[0] if a2p else None, "a2p_p95_ms": a2p[1] if len(a2p) > 1 else None,
            "video_bytes_per_s": video_bytes_per_s, "key_events": presses, "hud": hud,
            "receiver": receiver, "server": server}


def _server_view(url: str, token: str) -> dict:
    """The engine's side of the page's session (``/api/metrics`` with its ``token``): fps
    generated and targeted, denoising steps, generation ms per chunk, frames dropped,
    action-to-frame (command receipt -> frame ready) p50/p95 — what the HUD's figures are
    made of."""
    import httpx

    sessions = httpx.get(f"{url}/api/metrics", headers={"Authorization": f"Bearer {token}"},
                         timeout=10).json()["engine"]["sessions"]
    if len(sessions) != 1:
        return {}
    (m,) = sessions.values()
    keys = ("fps", "target_fps", "steps", "gen_ms_per_chunk", "dropped_frames",
            "action_to_frame_ms", "degrade_level")
    return {k: m.get(k) for k in keys}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench browser", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="builtin")
    parser.add_argument("--env", default=None, metavar="ID",
                        help="a game's learned world (play --env ID): its keys are pressed, "
                             "read from /api/controls")
    parser.add_argument("--model-path", default=None, metavar="DIR",
                        help="with --env: the world's folder (default: the shipped one)")
    parser.add_argument("--mode", choices=("responsive", "quality"), default="responsive")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the server")
    parser.add_argument("--json", default=None)
    parser.add_argument("--screenshot", default=None, metavar="PNG",
                        help="save a PNG of the page at the end")
    args = parser.parse_args(argv)
    if not CHROMIUM.exists():
        raise SystemExit(f"no Chromium at {CHROMIUM} (apt-get install chromium)")

    from worldstream.bench import results
    from worldstream.bench.common import hardware_info
    from worldstream.bench.results import context_md

    load_before = os.getloadavg()
    if args.env is not None:
        server_cm: PlayServer = GamePlayServer(args.env, args.model_path, args.threads)
    else:
        server_cm = PlayServer(args.model, max_sessions=1, threads=args.threads)
    with server_cm as server:
        keys = game_keys(server.url) if args.env is not None else None
        got = run(server.url, args.mode, args.seconds, keys=keys, screenshot=args.screenshot)
    payload = results.stamp_payload("browser", {
        "hardware": hardware_info(),
        "settings": {"model": args.model, "env": args.env, "model_path": args.model_path,
                     "mode": args.mode, "seconds": args.seconds, "threads": args.threads,
                     "keys": keys or KEYS, "load_before": load_before}, **got}, argv)
    md = ("# Action-to-photon in the browser (the page's HUD)\n\n" + context_md(payload)
          + f"\nHUD action-to-photon p50 / p95: **{got['a2p_p50_ms']} / {got['a2p_p95_ms']} ms** "
            f"over {got['key_events']} key events; video {got['video_bytes_per_s']} bytes/s; "
            f"HUD: {got['hud']}; the engine's view: "
            f"{got['server']}; the browser's receiver: {got['receiver']}.\n")
    folder = results.save("browser" if args.env is None else "browser_game", payload, md, {})
    print(f"[browser] {got}", file=sys.stderr)
    print(f"report: {folder / 'result.md'}", file=sys.stderr)
    results.print_json(payload, args.json)
    return 0
