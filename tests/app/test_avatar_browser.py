"""Browser end to end in the avatar world (issue 16): Chromium opens the page served with the
real engine and the avatar simulator backend; the page shows the avatar's controls, a number key
changes the expression and typed text moves the mouth, judged by the frames the video shows."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import LiveServer
from tests.fixtures.browser import CHROMIUM, CHROMIUM_ARGS, grab, next_frame
from worldstream.app.access import AccessPolicy
from worldstream.app.server import create_app
from worldstream.streaming.webrtc import bind_media

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason=f"no Chromium at {CHROMIUM}"),
]

MOUTH_INSIDE = np.array([60, 15, 20])  # the simulator's colour of an open mouth's inside


def open_mouth_pixels(frame: np.ndarray) -> int:
    """Pixels of the face's lower half near the open-mouth colour (video compression shifts
    colours, hence the wide tolerance; the office look has no such colour near the face)."""
    region = frame[58:86, 44:84].astype(int)
    return int((np.abs(region - MOUTH_INSIDE).sum(-1) < 90).sum())


def frames_for(page, n: int) -> list[np.ndarray]:
    frames = [grab(page)]
    while len(frames) < n:
        frames.append(next_frame(page, frames[-1]))
    return frames


@pytest.fixture(scope="module")
def avatar_engine():
    from worldstream.app.cmd_play import play_config
    from worldstream.engine.core.engine import Engine
    from worldstream.engine.core.registry import load_backend

    engine = Engine(load_backend("avatar-sim"), play_config(max_sessions=2)).start()
    # warm up the prompt encoder (seconds here, minutes on an overloaded machine)
    info = engine.create_session("a person with glasses in an office", seed=0)
    assert engine.subscribe(info.session_id).get(timeout=300) is not None
    engine.close_session(info.session_id)
    yield engine
    engine.stop()


def test_avatar_page_expression_key_and_say_box(avatar_engine):
    from playwright.sync_api import sync_playwright

    bind_media("127.0.0.1")
    app = create_app(avatar_engine, access=AccessPolicy.for_bind("127.0.0.1"))
    with LiveServer(app) as server, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(server.url, wait_until="domcontentloaded")
            page.wait_for_function(
                "document.getElementById('ws-badge')?.dataset.kind === 'webrtc'", timeout=60_000)
            page.wait_for_function("document.getElementById('ws-video').videoWidth > 0")
            assert page.get_attribute("#ws-root", "data-world") == "avatar"
            assert page.locator("[data-expression]").count() == 5
            # neutral and silent: the mouth is shut in every frame
            page.wait_for_timeout(500)
            assert max(open_mouth_pixels(f) for f in frames_for(page, 6)) <= 3
            # key 3 = surprise: the jaw drops and stays open while the expression holds
            page.click("#ws-stage")
            page.keyboard.press("Digit3")
            page.wait_for_timeout(1200)
            surprised = frames_for(page, 6)
            assert min(open_mouth_pixels(f) for f in surprised) > 10
            # key 1 = neutral again: shut
            page.keyboard.press("Digit1")
            page.wait_for_timeout(1200)
            assert max(open_mouth_pixels(f) for f in frames_for(page, 4)) <= 3
            # typed text: the mouth opens, and shuts again (~6 s of speech: on a loaded machine
            # a grab takes over a second, so the speech must outlast a few)
            page.fill("#ws-say", "hello wonderful world, how are you today? we are all very "
                      "well here, thank you")
            page.click("#ws-say-send")
            frame, counts = grab(page), []
            for _ in range(200):  # until the mouth has opened and is shut again
                frame = next_frame(page, frame)
                counts.append(open_mouth_pixels(frame))
                if max(counts) > 10 and counts[-1] <= 3:
                    break
            assert max(counts) > 10 and counts[-1] <= 3, counts
        finally:
            browser.close()
            bind_media(None)
