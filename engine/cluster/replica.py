"""One engine replica: a backend, its page pool and its engine thread in a process of its own,
driven by the front end through Ray.

NOTE: a Ray *actor*, not a Ray Serve deployment. A session's frames are a continuous stream
that must reach the front end's WebRTC track within milliseconds, and every control message of
a session must reach the one process that holds its KV cache. Serve routes requests, not
long-lived per-session streams, and its model multiplexing keys requests to replicas but
cannot address a replica's session state for streaming back; an actor handle per replica plus
a placement table in the front end gives affinity by construction, and a long-polled
:meth:`EngineReplica.pull` streams frames back with one round trip per batch of frames.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections import Counter
from typing import Any

import numpy as np

from worldstream.engine.core.api import Command, SessionClosedError, SessionInfo
from worldstream.engine.core.config import EngineConfig
from worldstream.engine.core.engine import Engine
from worldstream.engine.core.registry import load_backend
from worldstream.engine.studio import worldio

#: frames a session may pile up in its replica between two pulls (a stalled front end)
PULL_SLOT_FRAMES = 64
#: the studio operations a front end may run on a replica's session (``engine.studio.worldio``)
STUDIO_OPS = ("export_log", "save", "load", "start_from_picture", "play_story")
#: how long a studio operation may wait for the engine thread, s (it runs between two chunks)
STUDIO_WAIT_S = 60.0


class EngineReplica:
    """The actor class (``ray.remote(EngineReplica)`` in :mod:`engine.cluster.router`; plain
    Python here, so it is testable without Ray). Thread-safe: :meth:`pull` and :meth:`metrics`
    run in a concurrency group of their own beside the commands.

    Args:
        model: backend name for ``engine.core.registry.load_backend`` (``builtin``, ``sim``, ...).
        config: the engine settings (as ``worldstream play`` makes them).
        model_kwargs: passed to ``load_backend`` (e.g. ``path``).
        threads: torch threads of this process (None: leave as is).
    """

    def __init__(self, model: str, config: EngineConfig, model_kwargs: dict | None = None,
                 threads: int | None = None):
        if threads is not None:
            import torch

            torch.set_num_threads(threads)
        backend = load_backend(model, **(model_kwargs or {}))
        # as `worldstream play` does: load the model's prompt encoder before the first session
        # (seconds on an idle machine, far longer under load), or that session stalls
        prepare = getattr(backend, "prepare_prompt", None)
        if prepare is not None:
            prepare("warm-up")
        self.engine = Engine(backend, config).start()
        self._slots: dict[str, Any] = {}
        self._received: Counter[str] = Counter()
        self._lock = threading.Lock()

    def describe(self) -> dict:
        """``pid``, ``node`` (host name), ``model``, ``capacity``, ``width``, ``height``."""
        backend = self.engine.backend
        return {"pid": os.getpid(), "node": socket.gethostname(), "model": self.engine.model_name,
                "capacity": self.engine.capacity, "width": backend.width,
                "height": backend.height}

    def create_session(self, prompt: str, seed: int | None, fps: int | None,
                       history: tuple[np.ndarray, list[frozenset[str]]] | None = None
                       ) -> SessionInfo:
        """A session on this replica (its frames are collected for :meth:`pull`); raises as
        ``Engine.create_session``."""
        info = self.engine.create_session(prompt, seed=seed, fps=fps, history=history)
        with self._lock:
            self._slots[info.session_id] = self.engine.subscribe(info.session_id,
                                                                 PULL_SLOT_FRAMES)
        return info

    def submit(self, session_id: str, command: Command) -> None:
        with self._lock:
            self._received[session_id] += 1
        self.engine.submit(session_id, command)

    def set_paused(self, session_id: str, paused: bool) -> None:
        self.engine.set_paused(session_id, paused)

    def studio(self, op: str, session_id: str, *args: Any) -> dict:
        """Run studio operation ``op`` (one of ``STUDIO_OPS``: the input log, a save point's
        bytes, a load, a start from a picture, a storyboard) on one of this replica's sessions
        and wait for the engine thread. Returns ``{"value": result}``, or ``{"error": class
        name, "message": one line, "retry_after_s": float | None}``: failures travel as data,
        since Ray would wrap the exception in its own traceback."""
        try:
            if op not in STUDIO_OPS:
                raise ValueError(f"unknown studio operation {op!r}; expected one of "
                                 f"{STUDIO_OPS}")
            return {"value": getattr(worldio, op)(self.engine, session_id, *args).result(
                timeout=STUDIO_WAIT_S)}
        except Exception as err:  # every failure is the caller's answer, not the actor's death
            return {"error": type(err).__name__, "message": str(err),
                    "retry_after_s": getattr(err, "retry_after_s", None)}

    def close_session(self, session_id: str) -> None:
        with self._lock:
            self._slots.pop(session_id, None)
            self._received.pop(session_id, None)
        try:
            self.engine.close_session(session_id)
        except SessionClosedError:
            pass

    def pull(self, timeout_s: float = 0.05) -> dict:
        """Frames and events since the last pull, waiting up to ``timeout_s`` for the first.

        Returns ``{"now_ns": perf_counter_ns here (to translate the frames' times),
        "frames": [Frame], "events": [(session_id, Event)], "closed": [session_id]}``."""
        deadline = time.monotonic() + timeout_s
        frames, events, closed = [], [], []
        while True:
            with self._lock:
                slots = list(self._slots.items())
            for session_id, slot in slots:
                while (frame := slot.get(timeout=0)) is not None:
                    frames.append(frame)
                try:
                    queue = self.engine.events(session_id)
                except SessionClosedError:  # ended here (e.g. a backend failure)
                    closed.append(session_id)
                    with self._lock:
                        self._slots.pop(session_id, None)
                    continue
                while not queue.empty():
                    events.append((session_id, queue.get_nowait()))
            if frames or events or closed or time.monotonic() >= deadline:
                return {"now_ns": time.perf_counter_ns(), "frames": frames, "events": events,
                        "closed": closed}
            time.sleep(0.002)

    def metrics(self) -> dict:
        """The engine's metrics plus ``received`` (commands per session: affinity),
        ``chunk_ms_p50``/``chunk_ms_p95`` (generation time per chunk over its sessions) and
        each session's latency budget (``budgets``)."""
        metrics = self.engine.metrics()
        gen = [m["gen_ms_per_chunk"] for m in metrics["sessions"].values()
               if m["gen_ms_per_chunk"] is not None]
        budgets = {}
        for session_id in metrics["sessions"]:
            try:
                budgets[session_id] = self.engine.latency_budget(session_id)
            except SessionClosedError:
                pass
        with self._lock:
            received = dict(self._received)
        return {**metrics, "received": received, "budgets": budgets,
                "chunk_ms_p50": float(np.percentile(gen, 50)) if gen else None,
                "chunk_ms_p95": float(np.percentile(gen, 95)) if gen else None,
                **self.describe()}

    def stop(self) -> None:
        self.engine.stop()
