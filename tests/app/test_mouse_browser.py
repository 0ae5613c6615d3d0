"""Browser end to end, mouse look: Chromium opens the page of a world that takes mouse input
(the test world of ``tests.fixtures.mouse``: a bar at the heading); the page shows its
pointer-capture hint, a drag on the video to the right turns the view right (the world moves
left) within the next chunk, and the HUD counts the drag as an action; the click that ended the
drag captured the pointer (moving it looks on), Escape releases it."""

from __future__ import annotations

import time

import pytest

from tests.conftest import LiveServer
from tests.fixtures.browser import CHROMIUM, CHROMIUM_ARGS, grab
from tests.fixtures.mouse import LOOK_SCALE, LookBackend, bar_column
from worldstream.app.access import AccessPolicy
from worldstream.app.cmd_play import play_config
from worldstream.app.server import create_app
from worldstream.engine.core.engine import Engine
from worldstream.streaming.webrtc import bind_media

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason=f"no Chromium at {CHROMIUM}"),
]

DRAG_PX = 80


def test_a_drag_turns_the_view_and_counts_as_an_action():
    from playwright.sync_api import sync_playwright

    bind_media("127.0.0.1")
    with Engine(LookBackend(), play_config(max_sessions=2)) as engine:
        app = create_app(engine, access=AccessPolicy.for_bind("127.0.0.1"))
        with LiveServer(app) as server, sync_playwright() as p:
            browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
            try:
                page = browser.new_page(viewport={"width": 1280, "height": 800})
                page.goto(server.url, wait_until="domcontentloaded")
                page.wait_for_function(
                    "document.getElementById('ws-badge')?.dataset.kind === 'webrtc'",
                    timeout=60_000)
                page.wait_for_function("document.getElementById('ws-video').videoWidth > 0")
                page.wait_for_function("window.worldstream.mouse?.enabled === true")
                assert "click the video to capture" in page.inner_text("#ws-mouse-hint")
                start = bar_column(grab(page))
                samples = page.evaluate("window.worldstream.a2p.length")
                box = page.locator("#ws-video").bounding_box()
                x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
                page.mouse.move(x, y)
                page.mouse.down()
                page.mouse.move(x + DRAG_PX, y, steps=8)
                page.mouse.up()
                sent = time.monotonic()
                turned = None
                while time.monotonic() - sent < 5 and turned is None:
                    page.wait_for_timeout(30)
                    column = bar_column(grab(page))
                    if abs(column - start) > 2:
                        turned = (column, time.monotonic() - sent)
                # the first frame that turned: looking right moves the world left
                assert turned is not None, "the view did not turn"
                assert turned[0] < start - 2, (start, turned)
                # and all of the drag arrives (its messages may span chunks), scaled
                want = start - DRAG_PX * LOOK_SCALE
                deadline = time.monotonic() + 3
                while abs(bar_column(grab(page)) - want) > 3 and time.monotonic() < deadline:
                    page.wait_for_timeout(30)
                assert bar_column(grab(page)) == pytest.approx(want, abs=3)
                page.wait_for_function(f"window.worldstream.a2p.length > {samples}")
                assert page.evaluate("window.worldstream.mouse.sent") >= 1
                assert "rejected" not in page.inner_text("#ws-log")
                # the drag ended in a click: the pointer is captured; moving it looks on
                page.wait_for_function("document.pointerLockElement !== null && document"
                                       ".getElementById('ws-mouse-hint').textContent"
                                       ".includes('mouse captured')")
                page.mouse.move(x + DRAG_PX + 40, y, steps=4)
                want -= 40 * LOOK_SCALE
                deadline = time.monotonic() + 3
                while abs(bar_column(grab(page)) - want) > 3 and time.monotonic() < deadline:
                    page.wait_for_timeout(30)
                assert bar_column(grab(page)) == pytest.approx(want, abs=3)
                page.keyboard.press("Escape")  # releases it
                page.wait_for_function("document.pointerLockElement === null && document"
                                       ".getElementById('ws-mouse-hint').textContent"
                                       ".includes('click the video to capture')")
            finally:
                browser.close()
