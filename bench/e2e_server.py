"""The in-process side of ``bench e2e`` (and of ``bench replicas``' failover run): the app
served on a loopback port, a follower keeping every frame the engine sends, and busy processes
for ``--stress``."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
import time


class SentFrames:
    """Every frame the in-process engine sends on the first session opened after entry
    (``frames``: index -> rgb), taken from a slot of its own, for the corruption check."""

    def __init__(self, engine):
        self.engine, self.frames = engine, {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, daemon=True)

    def _follow(self) -> None:
        slot = None
        while slot is None and not self._stop.wait(0.005):
            sessions = list(self.engine.metrics()["sessions"])
            if sessions:
                slot = self.engine.subscribe(sessions[0], maxlen=4096)
        while slot is not None and not self._stop.is_set():
            frame = slot.get(timeout=0.1)
            if frame is not None:
                self.frames[frame.index] = frame.rgb

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(5)


@contextlib.contextmanager
def busy_processes(n: int):
    """``n`` processes spinning on a CPU core each (``--stress``), stopped on exit."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield procs
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


class LocalServer:
    """The app served in-process (uvicorn in a thread) on a free port of ``host`` (loopback by
    default), with ``limits`` (``streaming.limits.Limits``; default ``Limits()``); the page
    too with ``ui`` (the browser tests)."""

    def __init__(self, engine, limits=None, host: str = "127.0.0.1", ui: bool = False):
        import socket

        import uvicorn

        from worldstream.app.server import create_app

        with socket.socket() as s:
            s.bind((host, 0))
            self.port = s.getsockname()[1]
        self.url = f"http://{host}:{self.port}"
        self._server = uvicorn.Server(uvicorn.Config(
            create_app(engine, limits, ui=ui), host=host, port=self.port,
            log_level="warning"))
        self._thread = threading.Thread(target=self._server.run, daemon=True)

    def __enter__(self):
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the benchmark server did not start")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc):
        self._server.should_exit = True
        self._thread.join(10)

