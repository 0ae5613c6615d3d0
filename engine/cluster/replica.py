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

import contextlib
import os
import socket
import threading
import time
from collections import Counter
from typing import Any

import numpy as np

from worldstream.engine.core.api import (
    Command,
    Event,
    EventQueue,
    SessionClosedError,
    SessionInfo,
)
from worldstream.engine.core.backend import Observes, PromptPrefetch
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
        forward_all: every session's frames go to the front end through :meth:`pull` (the
            front end sends the media). False: only those of sessions asked for with
            :meth:`forward_frames` (media leaves from here: ``streaming.replica_media``), and
            each session's events are also kept here for a local transport
            (:meth:`local_events`).
    """

    #: whether its sessions' media leave from its own host (a subclass with a transport)
    serves_media: bool = False

    def __init__(self, model: str, config: EngineConfig, model_kwargs: dict | None = None,
                 threads: int | None = None, forward_all: bool = True):
        if threads is not None:
            import torch

            torch.set_num_threads(threads)
        backend = load_backend(model, **(model_kwargs or {}))
        # as `worldstream play` does: load the model's prompt encoder before the first session
        # (seconds on an idle machine, far longer under load), or that session stalls
        if isinstance(backend, PromptPrefetch):
            backend.prepare_prompt("warm-up")
        self.engine = Engine(backend, config).start()
        self.forward_all = forward_all
        self._sessions: set[str] = set()
        self._slots: dict[str, Any] = {}  # the sessions whose frames go to the front end
        self._local: dict[str, EventQueue] = {}  # events kept for a transport here
        self._notes: list[tuple[str, dict]] = []  # for the front end, with the next pull
        self._received: Counter[str] = Counter()
        self._paused: set[str] = set()
        self._lock = threading.Lock()

    def describe(self) -> dict:
        """``pid``, ``node`` (host name), ``address`` (this host's IP in the Ray cluster),
        ``model``, ``capacity``, ``width``, ``height``, ``observes`` (whether a failover can
        re-cache recent frames: the journal needs them), and what the front end's page and
        wire need of the model: ``world``, ``wire_keys`` (its own key names, or None),
        ``controls`` (the page's key map, or None), ``mouse`` (whether it takes mouse
        motion: ``pointer`` in actions), ``pixel_art``."""
        backend, engine = self.engine.backend, self.engine
        return {"pid": os.getpid(), "node": socket.gethostname(), "address": _node_address(),
                "model": engine.model_name, "capacity": engine.capacity,
                "width": backend.width, "height": backend.height,
                "observes": isinstance(backend, Observes), "world": engine.world,
                "wire_keys": engine.wire_keys, "controls": engine.controls,
                "mouse": engine.info.mouse, "pixel_art": engine.pixel_art}

    def create_session(self, prompt: str, seed: int | None, fps: int | None,
                       history: tuple[np.ndarray, list[frozenset[str]]] | None = None
                       ) -> SessionInfo:
        """A session on this replica (its frames are collected for :meth:`pull`); raises as
        ``Engine.create_session``."""
        info = self.engine.create_session(prompt, seed=seed, fps=fps, history=history)
        with self._lock:
            self._sessions.add(info.session_id)
            if not self.forward_all:
                self._local[info.session_id] = EventQueue()
        if self.forward_all:
            self.forward_frames(info.session_id, True)
        return info

    def forward_frames(self, session_id: str, on: bool) -> None:
        """Send (or stop sending) this session's frames to the front end with each pull."""
        with self._lock:
            if not on:
                self._slots.pop(session_id, None)
                return
            if session_id in self._slots or session_id not in self._sessions:
                return
        slot = self.engine.subscribe(session_id, PULL_SLOT_FRAMES)  # SessionClosedError
        with self._lock:
            self._slots[session_id] = slot

    def local_events(self, session_id: str) -> EventQueue:
        """The copy of the session's events kept here (``forward_all=False``); raises
        SessionClosedError for a session this replica does not hold."""
        with self._lock:
            queue = self._local.get(session_id)
        if queue is None:
            raise SessionClosedError(session_id)
        return queue

    def post_event(self, session_id: str, kind: str, payload: dict) -> None:
        """An event from the front end for the local transport (e.g. ``recovered`` after a
        failover): it reaches the page when its connection here opens."""
        with contextlib.suppress(SessionClosedError):  # closed meanwhile
            self.local_events(session_id).put(Event(kind, payload))

    def note(self, session_id: str, payload: dict) -> None:
        """A message for the front end about ``session_id``, sent with the next pull."""
        with self._lock:
            self._notes.append((session_id, payload))

    def submit(self, session_id: str, command: Command) -> None:
        with self._lock:
            self._received[session_id] += 1
        self.engine.submit(session_id, command)

    def set_paused(self, session_id: str, paused: bool) -> None:
        self.engine.set_paused(session_id, paused)
        with self._lock:
            (self._paused.add if paused else self._paused.discard)(session_id)

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
            self._sessions.discard(session_id)
            self._slots.pop(session_id, None)
            self._local.pop(session_id, None)
            self._received.pop(session_id, None)
            self._paused.discard(session_id)
        try:
            self.engine.close_session(session_id)
        except SessionClosedError:
            pass

    def pull(self, timeout_s: float = 0.05) -> dict:
        """Frames, events and notes since the last pull, waiting up to ``timeout_s`` for the
        first.

        Returns ``{"now_ns": perf_counter_ns here (to translate the frames' times),
        "frames": [Frame] (the forwarded sessions'), "events": [(session_id, Event)],
        "notes": [(session_id, dict)], "closed": [session_id], "indices": {session_id: the
        public frame index after the newest a transport here got (:meth:`_stamped`)}``. Events
        are drained for every session; with ``forward_all=False`` each is also kept for the
        local transport."""
        deadline = time.monotonic() + timeout_s
        frames: list = []
        events: list = []
        closed: list = []
        notes: list = []
        indices: dict[str, int] = {}
        while True:
            with self._lock:
                slots = list(self._slots.values())
                sessions = list(self._sessions)
                notes, self._notes = notes + self._notes, []
            for slot in slots:
                while (frame := slot.get(timeout=0)) is not None:
                    frames.append(frame)
            for session_id in sessions:
                try:
                    queue = self.engine.events(session_id)
                except SessionClosedError:  # ended here (e.g. a backend failure)
                    closed.append(session_id)
                    with self._lock:
                        self._sessions.discard(session_id)
                        self._slots.pop(session_id, None)
                    continue
                with self._lock:
                    local = self._local.get(session_id)
                while not queue.empty():
                    event = queue.get_nowait()
                    events.append((session_id, event))
                    if local is not None:
                        local.put(event)
            # NOTE: a command note (the journal's copy of steering) waits for the next pull
            # that returns anyway: one round trip per key press would cost the front end more
            # than the journal needs (the last action, seconds apart at worst)
            urgent = any(n.get("kind") != "command" for _, n in notes)
            # NOTE: new frame indices ride on whatever pull returns (at most ``timeout_s``
            # late): returning for them alone would cost the front end a round trip per chunk;
            # a failover numbers on past what could have come since (``failover.recreate``)
            indices.update(self._stamped())
            if frames or events or closed or urgent or time.monotonic() >= deadline:
                return {"now_ns": time.perf_counter_ns(), "frames": frames, "events": events,
                        "notes": notes, "closed": closed, "indices": indices}
            # NOTE: with media sent from here, what the front end gets is not on any frame's
            # path: poll less often, and the replica's host process stays near idle
            time.sleep(0.002 if self.forward_all else 0.01)

    def _stamped(self) -> dict[str, int]:
        """Sessions whose frames went to a transport in this process since the last call:
        session id -> the public index after the newest. None here: every frame goes through
        the front end, which numbers it (``streaming.replica_media`` numbers its own)."""
        return {}

    def metrics(self) -> dict:
        """The engine's metrics plus ``received`` (commands per session: affinity),
        ``chunk_ms_p50``/``chunk_ms_p95`` (generation time per chunk over its sessions),
        each session's latency budget (``budgets``) and ``unpaused`` (sessions that should be
        generating: with ``batches``, how the front end tells a stuck engine)."""
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
            unpaused = len(self._sessions - self._paused)
        return {**metrics, "received": received, "budgets": budgets, "unpaused": unpaused,
                "chunk_ms_p50": float(np.percentile(gen, 50)) if gen else None,
                "chunk_ms_p95": float(np.percentile(gen, 95)) if gen else None,
                **self.describe()}

    def stop(self) -> None:
        self.engine.stop()


def _node_address() -> str | None:
    """This host's address in the Ray cluster (None outside Ray): where its media can leave."""
    try:
        import ray

        return ray.util.get_node_ip_address() if ray.is_initialized() else None
    except Exception:  # not in a Ray worker (plain Python tests)
        return None
