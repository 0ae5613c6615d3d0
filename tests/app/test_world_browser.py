"""Browser end to end for issue 15: Chromium plays a storyboard (and downloads its MP4 and its
JSON), saves and loads a save point, exports the input log, and starts from a picture (refused
by the simulator with its message; the built-in model shows the picture)."""

from __future__ import annotations

import io
import json

import av
import numpy as np
import pytest
from PIL import Image

from tests.conftest import LiveServer
from tests.fixtures.browser import CHROMIUM, CHROMIUM_ARGS, grab
from worldstream.app.access import AccessPolicy
from worldstream.app.server import create_app
from worldstream.engine.evaluation.metrics import psnr
from worldstream.engine.worlds.simulator import WorldSimulator
from worldstream.streaming.webrtc import bind_media

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason=f"no Chromium at {CHROMIUM}"),
]

STORY = {"seed": 3, "beats": [
    {"prompt": "a snowy forest", "duration_s": 1.5, "actions": [{"at_s": 0, "keys": ["right"]}]},
    {"prompt": "hot desert dunes", "duration_s": 1.5, "transition_s": 0.5}]}


def png(rgb: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, format="PNG")
    return buf.getvalue()


def open_page(browser, server):
    page = browser.new_page(viewport={"width": 1280, "height": 1400}, accept_downloads=True)
    page.goto(server.url, wait_until="domcontentloaded")
    page.wait_for_function("document.getElementById('ws-video')?.videoWidth > 0", timeout=90_000)
    page.wait_for_function("window.worldstream?.world !== undefined", timeout=30_000)
    return page


def wait_log(page, text, timeout=60_000):
    page.wait_for_function(
        f"document.getElementById('ws-log').textContent.includes({json.dumps(text)})",
        timeout=timeout)


def test_story_save_load_replay_export_and_picture_controls(sim_engine, tmp_path):
    from playwright.sync_api import sync_playwright

    bind_media("127.0.0.1")
    app = create_app(sim_engine, access=AccessPolicy.for_bind("127.0.0.1"))
    with LiveServer(app) as server, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = open_page(browser, server)
            # storyboard: edit, play, it records itself; its MP4 and JSON download
            page.fill("#ws-story", json.dumps(STORY))
            page.click("#ws-story-play")
            page.wait_for_function("window.worldstream.world.story?.done === true",
                                   timeout=60_000)
            assert page.inner_text("#ws-story-state") == "done · 2 beats"
            page.wait_for_function(
                "!document.getElementById('ws-download').classList.contains('ws-disabled')")
            mp4 = page.request.get(server.url + page.get_attribute("#ws-download", "href"))
            (tmp_path / "story.mp4").write_bytes(mp4.body())
            with av.open(str(tmp_path / "story.mp4")) as container:
                frames = sum(1 for _ in container.decode(video=0))
            assert frames >= 30  # the 3 s story at 20 fps (recording starts just after it)
            with page.expect_download() as story_file:
                page.click("#ws-story-export")
            assert json.loads(open(story_file.value.path()).read()) == STORY
            # save points: save, listed, load it back
            page.click("#ws-save")
            page.wait_for_function("document.querySelectorAll('#ws-saves li').length === 1")
            assert "#1" in page.inner_text("#ws-saves")
            page.click("#ws-saves li button")
            wait_log(page, "loaded save 1")
            # the input log of the loaded session: it starts from the save point
            with page.expect_download() as log_file:
                page.click("#ws-log-export")
            log = json.loads(open(log_file.value.path()).read())
            assert log["format"] == "worldstream-input-log/1"
            assert log["start"]["kind"] == "savepoint" and log["model"] == "sim"
            # a picture: the simulator cannot start from one, the page says so
            picture = WorldSimulator(seed=5, scene="desert").step(4)
            page.set_input_files("#ws-picture", files=[
                {"name": "p.png", "mimeType": "image/png", "buffer": png(picture)}])
            wait_log(page, "model 'sim' cannot start from a picture")
            page.set_input_files("#ws-picture", files=[
                {"name": "p.gif", "mimeType": "image/gif", "buffer": b"GIF89a"}])
            wait_log(page, "p.gif: not a PNG or JPEG picture")
        finally:
            browser.close()
            bind_media(None)


def test_builtin_model_starts_from_an_uploaded_picture():
    from playwright.sync_api import sync_playwright

    from worldstream.app.cmd_play import play_config
    from worldstream.engine.backends.builtin import load_builtin_backend
    from worldstream.engine.core.engine import Engine

    sim = WorldSimulator(seed=424_242, scene="desert")
    picture = [sim.step(4) for _ in range(3)][-1]
    bind_media("127.0.0.1")
    engine = Engine(load_builtin_backend(), play_config(max_sessions=2)).start()
    app = create_app(engine, access=AccessPolicy.for_bind("127.0.0.1"))
    try:
        with LiveServer(app) as server, sync_playwright() as p:
            browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
            try:
                page = open_page(browser, server)
                page.set_input_files("#ws-picture", files=[
                    {"name": "desert.png", "mimeType": "image/png", "buffer": png(picture)}])
                wait_log(page, "started from desert.png")
                page.wait_for_timeout(1500)
                # idle: the stream shows the picture it started from (through VP8)
                assert psnr(grab(page), picture) > 20.0
                # or start again from the frame on screen
                page.click("#ws-picture-frame")
                wait_log(page, "started from the current frame")
            finally:
                browser.close()
    finally:
        bind_media(None)
        engine.stop()
