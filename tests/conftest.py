"""Shared fixtures of the streaming/app tests: a tiny in-test engine (``FakeEngine``) for unit
tests, the real ``Engine`` over the ``sim`` backend for integration tests, and a live server."""

from __future__ import annotations

import os
import queue
import socket
import threading
import time

import numpy as np
import pytest

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

from worldstream.engine.core import api  # noqa: E402


class FakeEngine:
    """EngineAPI over a counter: frame n of a session is a flat image of value ``n % 256``,
    produced at ``fps`` by one thread and presented at ``n / fps`` s after the session's first
    frame; commands are recorded in ``submitted``."""

    model_name = "fake"
    world, wire_keys, controls, mouse, pixel_art, media_on_replicas = (
        "landscape", None, None, False, False, False)

    def __init__(self, capacity: int = 8, fps: int = 30, size: tuple[int, int] = (48, 64)):
        self.capacity, self.fps, self.size = capacity, fps, size
        self.submitted: list[tuple[str, api.Command]] = []
        self.paused_calls: list[tuple[str, bool]] = []
        self._sessions: dict[str, dict] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> FakeEngine:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(1 / self.fps):
            with self._lock:
                for sid, s in self._sessions.items():
                    if s["paused"]:
                        continue
                    rgb = np.full((*self.size, 3), s["n"] % 256, np.uint8)
                    now = time.perf_counter_ns()
                    s.setdefault("t0", now)
                    frame = api.Frame(sid, s["n"], rgb, s["action_seq"], 0, s["n"] // 2,
                                      {"denoise": 1.0}, now, s["action_t"],
                                      present_ns=s["t0"] + round(s["n"] * 1e9 / self.fps))
                    for slot in s["slots"]:
                        slot.put(frame)
                    s["n"] += 1

    def create_session(self, prompt, seed=None, fps=None):
        with self._lock:
            if len(self._sessions) >= self.capacity:
                raise api.CapacityError("fake engine full", 7.0)
            sid = f"s{len(self.submitted)}-{time.perf_counter_ns()}"
            self._sessions[sid] = {"n": 0, "slots": [], "events": queue.Queue(),
                                   "action_seq": -1, "action_t": None, "paused": False}
        return api.SessionInfo(sid, self.size[1], self.size[0], fps or self.fps)

    def _get(self, sid):
        if sid not in self._sessions:
            raise api.SessionClosedError(sid)
        return self._sessions[sid]

    def submit(self, sid, command):
        with self._lock:
            s = self._get(sid)
            self.submitted.append((sid, command))
            if isinstance(command, api.ActionCommand):
                s["action_seq"], s["action_t"] = command.seq, command.t_ms
            if isinstance(command, api.RewindCommand) and command.chunks > 8:
                s["events"].put(api.Event("error", {"seq": command.seq, "code": "invalid",
                                                    "field": "chunks", "message": "too far"}))

    def subscribe(self, sid, maxlen=8):
        slot = api.FrameSlot(maxlen)
        with self._lock:
            self._get(sid)["slots"].append(slot)
        return slot

    def set_paused(self, sid, paused):
        with self._lock:
            s = self._get(sid)
            if s["paused"] and not paused and "t0" in s:  # frame n is due now, not in the past
                s["t0"] = time.perf_counter_ns() - round(s["n"] * 1e9 / self.fps)
            s["paused"] = paused
            self.paused_calls.append((sid, paused))

    def events(self, sid):
        with self._lock:
            return self._get(sid)["events"]

    def close_session(self, sid):
        with self._lock:
            s = self._sessions.pop(sid, None)
        if s is None:
            raise api.SessionClosedError(sid)
        for slot in s["slots"]:
            slot.close()

    def num_sessions(self):
        return len(self._sessions)

    def metrics(self):
        return {"sessions": len(self._sessions)}

    def latency_budget(self, sid):
        with self._lock:
            self._get(sid)
        return {"mode": None, "chunk_frames": 2, "steps": 1, "fps": self.fps, "plan_ms": 1.0,
                "wait_ms": 1e3 / self.fps, "floor_ms": 1.0 + 1e3 / self.fps}


@pytest.fixture
def fake_engine():
    engine = FakeEngine().start()
    yield engine
    engine.stop()


@pytest.fixture(scope="session")
def sim_engine():
    """The real engine streaming the ground-truth simulator (deterministic motion)."""
    from worldstream.app.cmd_play import play_config
    from worldstream.engine.core.engine import Engine
    from worldstream.engine.core.registry import load_backend

    engine = Engine(load_backend("sim"), play_config(max_sessions=4)).start()
    # warm up: the first session loads the text encoder (~10 s here, minutes when the machine
    # is overloaded), so that the tests time streaming only
    info = engine.create_session("a green meadow with ponds", seed=0)
    assert engine.subscribe(info.session_id).get(timeout=300) is not None, (
        "the engine made no frame in 300 s")
    engine.close_session(info.session_id)
    yield engine
    engine.stop()


def phase_shift(a: np.ndarray, b: np.ndarray, mask: np.ndarray) -> tuple[float, float]:
    """``(dx, dy)`` in pixels such that ``b(x, y) ~ a(x - dx, y - dy)``: phase correlation of two
    ``(H, W, 3)`` frames, ``mask`` pixels (the centred player sprite) replaced by the mean, a flat
    Tukey window against edge effects, a parabolic sub-pixel peak."""
    from scipy.signal.windows import tukey

    def prep(rgb):
        grey = rgb.astype(np.float64).mean(axis=2)
        grey[mask] = grey[~mask].mean()
        grey -= grey.mean()
        return grey * np.outer(tukey(grey.shape[0], 0.25), tukey(grey.shape[1], 0.25))

    fa, fb = np.fft.fft2(prep(a)), np.fft.fft2(prep(b))
    cross = fb * np.conj(fa)
    corr = np.real(np.fft.ifft2(cross / (np.abs(cross) + 1e-9)))
    py, px = np.unravel_index(np.argmax(corr), corr.shape)
    h, w = corr.shape

    def refine(c_minus, c0, c_plus):
        denom = c_minus - 2 * c0 + c_plus
        return 0.0 if denom == 0 else 0.5 * (c_minus - c_plus) / denom

    dx = px + refine(corr[py, (px - 1) % w], corr[py, px], corr[py, (px + 1) % w])
    dy = py + refine(corr[(py - 1) % h, px], corr[py, px], corr[(py + 1) % h, px])
    return (dx - w if dx > w / 2 else dx), (dy - h if dy > h / 2 else dy)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LiveServer:
    """uvicorn serving ``app`` on a free loopback port in a thread."""

    def __init__(self, app):
        import uvicorn

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port,
                                                     log_level="warning", lifespan="on"))
        self._thread = threading.Thread(target=self._server.run, daemon=True)

    def __enter__(self) -> LiveServer:
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc) -> None:
        self._server.should_exit = True
        self._thread.join(10)
