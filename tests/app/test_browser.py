"""Browser end to end: Debian's Chromium driven by Playwright opens the page served with the
real engine and the ``sim`` backend, the video plays, held keys steer it, the HUD shows an
action-to-photon figure. Saves a screenshot (``WORLDSTREAM_SCREENSHOT``, default
``/tmp/worldstream-play.png``)."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import LiveServer, phase_shift
from tests.fixtures.browser import CHROMIUM, CHROMIUM_ARGS, grab
from worldstream.app.access import AccessPolicy
from worldstream.app.server import create_app
from worldstream.engine.worlds.simulator import player_mask
from worldstream.streaming.webrtc import bind_media

SCREENSHOT = Path(os.environ.get("WORLDSTREAM_SCREENSHOT", "/tmp/worldstream-play.png"))

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason=(
        f"no Chromium at {CHROMIUM}: install it with "
        "`apt-get install -y --no-install-recommends chromium`")),
]


# the next n frames the page presents (requestVideoFrameCallback), each drawn in its own
# callback, with its stream index from its `frame` message (null when not matched)
PRESENTED = """(n) => new Promise((done) => {
  const S = window.worldstream, v = document.getElementById('ws-video');
  const c = document.createElement('canvas');
  c.width = v.videoWidth; c.height = v.videoHeight;
  const g = c.getContext('2d', { willReadFrequently: true });
  const out = [], t0 = performance.now();
  const tick = (now, md) => {
    g.drawImage(v, 0, 0);
    const d = g.getImageData(0, 0, c.width, c.height).data;
    let bytes = '';
    for (let i = 0; i < d.length; i += 4) bytes += String.fromCharCode(d[i], d[i + 1], d[i + 2]);
    const pts = (md.rtpTimestamp - S.rtpOrigin) >>> 0;
    const meta = S.frames.get(pts) ?? S.frames.get((pts + 1) >>> 0)
      ?? S.frames.get((pts - 1) >>> 0);
    out.push([meta ? meta.index : null, btoa(bytes)]);
    if (out.length < n && performance.now() - t0 < 20000) v.requestVideoFrameCallback(tick);
    else done([c.height, c.width, out]);
  };
  v.requestVideoFrameCallback(tick);
})"""


def presented_frames(page, n: int) -> list[tuple[int | None, np.ndarray]]:
    """``(stream index or None, (H, W, 3) uint8)`` of the next ``n`` presented frames (fewer
    if 20 s pass)."""
    import base64

    h, w, shown = page.evaluate(PRESENTED, n)
    return [(i, np.frombuffer(base64.b64decode(b), np.uint8).reshape(h, w, 3))
            for i, b in shown]


# requestVideoFrameCallbacks over 2 s, and how many of those frames the page matched
MATCHED_FRAMES = """() => new Promise((done) => {
  const S = window.worldstream, video = document.getElementById('ws-video');
  let shown = 0, matched = 0;
  const onMatch = () => { matched++; };
  S.listeners.presented.push(onMatch);
  const t0 = performance.now();
  const tick = () => {
    shown++;
    if (performance.now() - t0 < 2000) { video.requestVideoFrameCallback(tick); return; }
    S.listeners.presented.splice(S.listeners.presented.indexOf(onMatch), 1);
    done({ shown, matched });
  };
  video.requestVideoFrameCallback(tick);
})"""


def test_page_plays_steers_and_measures(sim_engine):
    from playwright.sync_api import TimeoutError as PageTimeout
    from playwright.sync_api import sync_playwright

    started = time.monotonic()
    # as `worldstream play` serves it: Host and Origin checked, media bound to loopback
    bind_media("127.0.0.1")
    app = create_app(sim_engine, access=AccessPolicy.for_bind("127.0.0.1"))
    with LiveServer(app) as server, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(server.url, wait_until="domcontentloaded")
            page.wait_for_function(
                "document.getElementById('ws-badge')?.dataset.kind === 'webrtc'", timeout=60_000)
            page.wait_for_function("document.getElementById('ws-video').videoWidth > 0")
            # the video plays: pixels change while idle (water shimmer, clouds, creatures)
            first = grab(page)
            page.wait_for_timeout(700)
            assert first.shape == (128, 128, 3)  # not pixel art: its own size, drawn smoothly
            assert page.evaluate("getComputedStyle(document.getElementById('ws-video'))"
                                 ".imageRendering") == "auto"
            assert np.abs(grab(page).astype(int) - first).mean() > 0.1
            # hold right: the camera moves right, the content moves left
            page.click("#ws-stage")
            page.keyboard.down("ArrowRight")
            page.wait_for_timeout(1200)
            # the median over pairs of frames the browser presented 1-3 stream frames apart,
            # per frame: the world moves ~6 px a frame and past half the 128-px frame a phase
            # shift aliases, so a pair farther apart (a loaded machine presents few frames)
            # measures nothing; one pair garbled by the codec must not decide it either
            shifts = []
            for _ in range(3):
                shown = presented_frames(page, 24)
                for (i, a), (j, b) in zip(shown, shown[1:]):
                    if i is not None and j is not None and 1 <= j - i <= 3:
                        dx, dy = phase_shift(a, b, player_mask())
                        shifts.append((dx / (j - i), dy / (j - i)))
                if len(shifts) >= 4:
                    break
            page.keyboard.up("ArrowRight")
            assert len(shifts) >= 3, f"the browser showed too few nearby frames: {shifts}"
            dx, dy = np.median(shifts, axis=0)
            assert dx < -1.0 and abs(dy) < 1.0, shifts
            # every presented video frame is matched to its frame message (RTP timestamps
            # within a tick: Chromium's went through microseconds), else an action's photon
            # is counted on a later frame; counted over ~2 s of callbacks, so load does not
            # decide it (frames shown late are still matched)
            matched = page.evaluate(MATCHED_FRAMES)
            assert matched["shown"] >= 10 and matched["matched"] >= 0.9 * matched["shown"], matched
            # the HUD shows an action-to-photon figure (p50 / p95 ms)
            page.keyboard.down("KeyW")
            page.wait_for_timeout(400)
            page.keyboard.up("KeyW")
            page.wait_for_function(
                "/^\\d+ \\/ \\d+$/.test(document.getElementById('hud-a2p').textContent)",
                timeout=10_000)
            p50, p95 = map(int, re.findall(r"\d+", page.inner_text("#hud-a2p")))
            assert 0 < p50 <= p95 < 5000
            assert float(page.inner_text("#hud-fps")) > 2  # frames flow (a loaded CI box is slow)
            # the HUD shows the mode, the floor of its settings and the per-stage budget; the
            # mode picker switches the session (the server's stats confirm it)
            page.wait_for_function(
                "document.getElementById('hud-mode').textContent.startsWith('responsive')",
                timeout=10_000)
            assert float(page.inner_text("#hud-floor")) > 0
            assert "planned chunk" in page.inner_text("#hud-budget")
            page.select_option("#ws-mode", "quality")
            page.wait_for_function(
                "document.getElementById('hud-mode').textContent.startsWith('quality')",
                timeout=10_000)
            # preview futures: 4 thumbnails, clicking one adopts it
            page.click("#ws-fork")
            page.wait_for_function(
                "document.querySelectorAll('#ws-previews img').length === 4", timeout=30_000)
            page.click("#ws-previews img >> nth=1")
            page.wait_for_function("!document.querySelector('#ws-previews img')")
            # record a second, stop, download: an MP4 file
            page.click("#ws-record")
            page.wait_for_function("window.worldstream.recording === true")
            page.wait_for_timeout(1000)
            page.click("#ws-record")
            page.wait_for_function(
                "!document.getElementById('ws-download').classList.contains('ws-disabled')")
            mp4 = page.request.get(server.url + page.get_attribute("#ws-download", "href"))
            assert mp4.status == 200 and mp4.body()[4:8] == b"ftyp"
            page.wait_for_timeout(1500)  # let the chart draw a few points
            page.screenshot(path=str(SCREENSHOT), full_page=True)
            page.close()
            # where WebRTC is unavailable the page falls back to the WebSocket by itself
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.add_init_script("delete window.RTCPeerConnection")
            page.goto(server.url, wait_until="domcontentloaded")
            page.wait_for_function(
                "document.getElementById('ws-badge')?.dataset.kind === 'websocket'",
                timeout=30_000)
            assert "WebSocket" in page.inner_text("#ws-badge")
            page.click("#ws-stage")
            page.keyboard.down("KeyD")
            page.wait_for_timeout(500)
            page.keyboard.up("KeyD")
            page.wait_for_function(
                "/^\\d+ \\/ \\d+$/.test(document.getElementById('hud-a2p').textContent)",
                timeout=10_000)
            page.screenshot(path=str(SCREENSHOT.with_name(SCREENSHOT.stem + "-websocket.png")))
            page.close()
            # the transport changed while the first WebRTC connection is being set up (its
            # offer held here until then): that start is cancelled, the page plays on the
            # WebSocket (it used to fail: "Cannot destructure 'session_id' of S.session")
            page = browser.new_page()
            held: list = []
            page.route("**/offer", lambda route: held.append(route))
            page.goto(server.url, wait_until="domcontentloaded")
            for _ in range(600):
                if held:
                    break
                page.wait_for_timeout(50)
            assert held, "the page made no offer"
            page.select_option("#ws-transport", "websocket")
            held[0].continue_()
            try:
                page.wait_for_function("window.worldstream.transport === 'websocket' && "
                                       "window.worldstream.presented.length >= 3",
                                       timeout=20_000)
            except PageTimeout:
                raise AssertionError(page.text_content("#ws-log")) from None
            assert page.evaluate("document.getElementById('ws-badge').dataset.kind") == \
                "websocket"
        finally:
            browser.close()
            bind_media(None)
    assert time.monotonic() - started < 120
