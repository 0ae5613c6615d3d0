"""Latency lab in the browser: Chromium (Playwright) runs a short latency session on the page
served with the real engine and the ``sim`` backend, over WebRTC and over the WebSocket
fallback, pressing the cued keys programmatically; the histogram counts the samples, and the
JSON/CSV exports parse with ``bench.analyse`` and agree with the server's frame log. Saves a
screenshot of the lab (``WORLDSTREAM_LAB_SCREENSHOT``, default
``/tmp/worldstream-latency-lab.png``)."""

from __future__ import annotations

import csv
import json
import math
import os
import time
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import LiveServer
from tests.fixtures.browser import CHROMIUM, CHROMIUM_ARGS
from worldstream.app.server import create_app
from worldstream.bench.analyse import analyse, load_export

SCREENSHOT = Path(os.environ.get("WORLDSTREAM_LAB_SCREENSHOT", "/tmp/worldstream-latency-lab.png"))
ACTIONS = 5
FRAME_SEEN = "window.worldstream.lab && window.worldstream.lab.lastFrameIndex !== null"
PRESS = {"up": "ArrowUp", "down": "KeyS", "left": "ArrowLeft", "right": "KeyD"}
WRONG = {"up": "ArrowDown", "down": "ArrowUp", "left": "ArrowRight", "right": "ArrowLeft"}

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason=f"no Chromium at {CHROMIUM}"),
]


def _percentile(sorted_values: list[float], p: float) -> float:
    """The page's definition: the value at rank floor(p/100 * n), clamped."""
    return sorted_values[min(len(sorted_values) - 1, math.floor(p / 100 * len(sorted_values)))]


def _run_session(page, screenshot: Path | None) -> None:
    page.select_option("#lab-count", str(ACTIONS))
    page.click("#lab-toggle")
    page.keyboard.press("ArrowUp")  # before any cue: ignored
    assert page.inner_text("#lab-state").startswith("too early")
    for i in range(ACTIONS):
        page.wait_for_function("window.worldstream.lab.cue !== null", timeout=5_000)
        key = page.evaluate("window.worldstream.lab.cue.key")
        if i == 0:
            page.keyboard.press(WRONG[key])  # the wrong key: ignored, the cue stays
            assert page.inner_text("#lab-state").startswith("wrong key")
            assert page.evaluate("window.worldstream.lab.records.length") == 0
        if i == ACTIONS - 1 and screenshot is not None:
            page.wait_for_timeout(200)  # the cue's flash is over
            page.screenshot(path=str(screenshot), full_page=True)
        page.keyboard.press(PRESS[key])
        page.wait_for_function(f"window.worldstream.lab.records.length === {i + 1}")
    page.wait_for_function("window.worldstream.lab.done === true", timeout=15_000)


def _check_exports(page, transport: str, tmp_path: Path) -> None:
    # the histogram panel: N samples, p50/p95 of those samples, bars drawn
    records = page.evaluate("JSON.stringify(window.worldstream.lab.records)")
    assert page.inner_text("#lab-n") == str(ACTIONS), records
    assert page.inner_text("#lab-missed") == "0"
    assert page.inner_text("#lab-progress") == f"{ACTIONS} / {ACTIONS}"
    drawn = page.evaluate("""() => { const c = document.getElementById('lab-hist');
      const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
      let n = 0; for (let i = 0; i < d.length; i += 4) if (d[i] > 200 && d[i + 2] < 60) n++;
      return n; }""")
    assert drawn > 100, "no histogram bars"
    with page.expect_download() as download:
        page.click("#lab-json")
    export = json.loads(Path(download.value.path()).read_text())
    meta, actions = load_export(export)
    assert len(actions) == ACTIONS and meta["transport"] == transport
    lat = sorted(a["latency_ms"] for a in actions)
    # shown as whole ms (JS rounds halves up, Python to even: compare within half a ms)
    assert abs(int(page.inner_text("#lab-p50")) - _percentile(lat, 50)) <= 0.5
    assert abs(int(page.inner_text("#lab-p95")) - _percentile(lat, 95)) <= 0.5
    assert analyse(actions)["answered"] == ACTIONS
    server = {(f["index"], f["rtp_ts"]): f for f in export["server_frames"]}
    for a in actions:
        assert a["t_photon_ms"] - a["t_action_ms"] == pytest.approx(a["latency_ms"], abs=1e-2)
        assert 0 < a["latency_ms"] < 5000
        assert a["t_cue_ms"] <= a["t_action_ms"] <= a["t_sent_ms"]
        assert a["frame_action_seq"] >= a["action_seq"] and a["transport"] == transport
        frame = server[(a["frame_index"], a["rtp_ts"])]  # merged from frames.json
        assert a["server_logged"] and frame["action_seq"] == a["frame_action_seq"]
        assert a["stages_ms"]["send_queue"] == frame["queue_ms"]
        assert {k: a["stages_ms"][k] for k in frame["stages_ms"]} == frame["stages_ms"]
        assert a["stages_ms"]["client_input"] == pytest.approx(
            a["t_sent_ms"] - a["t_action_ms"], abs=1e-2)
        assert a["stages_ms"]["client_present"] >= 0
    with page.expect_download() as download:
        page.click("#lab-csv")
    rows = list(csv.DictReader(Path(download.value.path()).open()))
    assert [int(r["action_seq"]) for r in rows] == [a["action_seq"] for a in actions]
    assert np.allclose([float(r["latency_ms"]) for r in rows],
                       [a["latency_ms"] for a in actions])
    assert all(float(r["stage_send_queue_ms"]) == a["stages_ms"]["send_queue"]
               for r, a in zip(rows, actions, strict=True))
    (tmp_path / f"session-{transport}.json").write_text(json.dumps(export))


def test_latency_session_over_webrtc_and_websocket(sim_engine, tmp_path):
    from playwright.sync_api import sync_playwright

    started = time.monotonic()
    with LiveServer(create_app(sim_engine)) as server, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 1000},
                                    accept_downloads=True)
            page.goto(server.url, wait_until="domcontentloaded")
            page.wait_for_function(
                "document.getElementById('ws-badge')?.dataset.kind === 'webrtc'", timeout=60_000)
            page.wait_for_function(FRAME_SEEN)
            _run_session(page, SCREENSHOT)
            _check_exports(page, "webrtc", tmp_path)
            page.close()
            page = browser.new_page(viewport={"width": 1280, "height": 1000},
                                    accept_downloads=True)
            page.add_init_script("delete window.RTCPeerConnection")
            page.goto(server.url, wait_until="domcontentloaded")
            page.wait_for_function(
                "document.getElementById('ws-badge')?.dataset.kind === 'websocket'",
                timeout=30_000)
            page.wait_for_function(FRAME_SEEN)
            _run_session(page, None)
            _check_exports(page, "websocket", tmp_path)
        finally:
            browser.close()
    assert time.monotonic() - started < 90
