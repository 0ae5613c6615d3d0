"""Browser end to end on a game world: Chromium opens the page of ``play --world breakout
--model sim``, the page learns the game's key map (its controls listed), Space serves without
scrolling the page and the held left arrow moves the paddle left. The game is pixel art: its
64x64 frames arrive as 256x256 video, each game pixel a uniform 4x4 block, drawn pixelated."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import LiveServer
from tests.fixtures.browser import CHROMIUM, CHROMIUM_ARGS, grab
from worldstream.app.access import AccessPolicy
from worldstream.app.cmd_play import play_config
from worldstream.app.server import create_app
from worldstream.engine.core.engine import Engine
from worldstream.engine.core.registry import backend_id, load_backend
from worldstream.streaming.webrtc import bind_media

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason=f"no Chromium at {CHROMIUM}"),
]


def paddle_x(frame: np.ndarray) -> float:
    """Column of Breakout's red paddle (rows 57-58 of a 64x64 frame; the red wall edge on the
    right excluded); the video is lossy, so any strongly red pixel counts."""
    rows = frame[57:59, :58].astype(int)
    red = (rows[..., 0] > 140) & (rows[..., 1] < 120) & (rows[..., 2] < 120)
    assert red.any(), "no paddle in the frame"
    return float(np.nonzero(red)[1].mean())


def game_frame(video: np.ndarray) -> np.ndarray:
    """The 64x64 game frame of a 256x256 video frame: the centre of each 4x4 block."""
    return video[2::4, 2::4]


def test_keys_of_the_game_move_the_paddle():
    from playwright.sync_api import sync_playwright

    bind_media("127.0.0.1")
    backend = load_backend(backend_id("breakout", "sim"))
    with Engine(backend, play_config(max_sessions=2)) as engine:
        app = create_app(engine, access=AccessPolicy.for_bind("127.0.0.1"))
        with LiveServer(app) as server, sync_playwright() as p:
            browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
            try:
                page = browser.new_page(viewport={"width": 1280, "height": 700})
                page.goto(server.url, wait_until="domcontentloaded")
                page.wait_for_function(
                    "document.getElementById('ws-badge')?.dataset.kind === 'webrtc'",
                    timeout=60_000)
                page.wait_for_function("document.getElementById('ws-video').videoWidth > 0")
                controls = page.inner_text("#ws-controls-list")
                assert "Space: FIRE" in controls and "← / A: LEFT" in controls, controls
                lamps = page.eval_on_selector_all(".ws-keys [data-key]",
                                                  "els => els.map(e => e.dataset.key)")
                assert sorted(lamps) == ["fire", "left", "right"]
                video = grab(page)
                assert video.shape == (256, 256, 3)
                blocks = video.reshape(64, 4, 64, 4, 3).astype(int)
                spread = (blocks.max(axis=(1, 3)) - blocks.min(axis=(1, 3))).max(axis=2)
                assert np.percentile(spread, 95) <= 16, np.percentile(spread, 95)
                assert page.evaluate("getComputedStyle(document.getElementById('ws-video'))"
                                     ".imageRendering") == "pixelated"
                page.click("#ws-stage")
                start = paddle_x(game_frame(grab(page)))
                scrolled = page.evaluate("window.scrollY")  # the click scrolled the stage in
                page.keyboard.press("Space")  # serve: the page sends "fire", never scrolls
                page.keyboard.down("ArrowLeft")
                page.wait_for_timeout(1500)
                moved = paddle_x(game_frame(grab(page)))
                page.keyboard.up("ArrowLeft")
                assert moved < start - 8, (start, moved)
                assert page.evaluate("window.scrollY") == scrolled
                assert "rejected" not in page.inner_text("#ws-log")
                sent = page.evaluate("window.worldstream.held.size")
                assert sent == 0
            finally:
                browser.close()
    backend.close()
