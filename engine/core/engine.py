"""The streaming engine: sessions over one :class:`~engine.core.backend.WorldBackend`, generated
chunk by chunk in its own thread behind a thread-safe command queue. That thread is the only
one that touches the backend (no backend needs to be thread-safe). Public methods validate,
register and enqueue, then return: no caller ever waits for a generation. One loop, calls going
one way: drain commands -> ask the scheduler for a batch -> ``backend.generate`` -> hand frames
to subscribers and account timeliness."""

from __future__ import annotations

import logging
import queue
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import numpy as np

from worldstream.engine.core.api import (
    ActionCommand,
    AdoptCommand,
    Command,
    EventQueue,
    ForkCommand,
    FrameSlot,
    PromptCommand,
    RewindCommand,
    SessionClosedError,
    SessionInfo,
    SettingsCommand,
)
from worldstream.engine.core.backend import (
    PreparesStates,
    PromptPrefetch,
    StepCost,
    WorldBackend,
    backend_info,
)
from worldstream.engine.core.batch import BatchRunner
from worldstream.engine.core.commands import CommandHandler, InvalidCommand
from worldstream.engine.core.config import EngineConfig
from worldstream.engine.core.figures import latency_budget, session_metrics
from worldstream.engine.core.inbox import Apply, Call, Close, Create, Item, Pause, Wake
from worldstream.engine.core.inputlog import InputLog
from worldstream.engine.core.limits import check_prompt
from worldstream.engine.core.playout import DegradeController
from worldstream.engine.core.prompts import PromptPrefetcher
from worldstream.engine.core.recache import check_history, observe_history
from worldstream.engine.core.scheduler import Scheduler
from worldstream.engine.core.session import Session
from worldstream.engine.core.stream_defaults import check_seed_and_fps, resolve_stream_defaults

log = logging.getLogger(__name__)

_COMMAND_TYPES = (ActionCommand, PromptCommand, SettingsCommand, ForkCommand, AdoptCommand,
                  RewindCommand)
#: the longest the engine thread sleeps with nothing due (it wakes at once on a command)
_MAX_IDLE_S = 0.05
#: how often the engine looks for slack while fork previews wait for it
_PREVIEW_POLL_NS = 2_000_000


class Engine:
    """Implements :class:`engine.core.api.EngineAPI` over ``backend``.

    Args:
        backend: the world model (or the simulator) generating chunks.
        config: engine settings (default :class:`EngineConfig`()).
    Raises ValueError when the config does not fit the backend (fps, chunk size).
    Use as a context manager, or call :meth:`start` and :meth:`stop`.
    """

    def __init__(self, backend: WorldBackend, config: EngineConfig | None = None):
        self.backend = backend
        self.config = config = config or EngineConfig()
        self.model_name = backend.name
        #: what the backend is, read once (world, keys, chunk sizes, action space)
        self.info = info = backend_info(backend)
        #: the world the backend streams (the page adapts to it)
        self.world = info.world
        #: its frames are pixel art (``SessionInfo.pixel_art``)
        self.pixel_art = info.pixel_art
        #: a game's own key names (None: ``limits.DIRECTION_KEYS``) and the page's key map
        self.wire_keys, self.controls = info.wire_keys, info.controls
        #: whether the model takes mouse motion (``pointer`` in actions)
        self.mouse = info.mouse
        #: media leave from this process (a cluster's replicas say otherwise)
        self.media_on_replicas = False
        self.capacity = min(config.max_sessions, backend.max_states)
        # the core knows keys, not actions: the backend names its own action for them
        self.idle_action = backend.key_action(frozenset())
        defaults = resolve_stream_defaults(backend, info, config)  # ValueError
        self.default_fps, self.default_steps = defaults.fps, defaults.steps
        self.chunk_sizes, self.chunk_frames = defaults.chunk_sizes, defaults.chunk_frames
        self.rewind_chunks = defaults.rewind_chunks
        self._lock = threading.Lock()  # sessions dict, subscribers, stats, live-state count
        self._sessions: dict[str, Session] = {}
        # admission, the state budget and the plan of each batch; the commands
        self.scheduler = Scheduler(config, backend.max_states)
        self.commands = CommandHandler(backend, info, config, self.scheduler.budget,
                                       self._lock, self.chunk_sizes, self.rewind_chunks)
        self._commands: queue.Queue[Item] = queue.Queue()
        # a backend that encodes a prompt ahead (thread-safe): off this thread
        self._prompts = None if not isinstance(backend, PromptPrefetch) else PromptPrefetcher(
            lambda c: backend.prepare_prompt(c.text, c.blend_text, c.blend_weight),
            self._commands.put, config.prompts_per_s)
        # relative chunk cost per step count (DegradeController skips ties)
        self._step_cost = backend.step_cost if isinstance(backend, StepCost) else None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._batches = BatchRunner(backend, info, config, self._lock, self._fail)

    # ------------------------------------------------------------ lifecycle
    def start(self) -> Engine:
        if self._thread is not None:
            raise RuntimeError("engine already started")
        self._thread = threading.Thread(target=self._run, name="worldstream-engine", daemon=True)
        self._thread.start()
        if self._prompts is not None:
            self._prompts.start()
        return self

    def stop(self) -> None:
        """Stop the engine thread, free every state, close every session. Idempotent."""
        self._stop.set()
        if self._prompts is not None:
            self._prompts.stop()
        self._commands.put(Wake())
        if self._thread is not None:
            self._thread.join()
        with self._lock:
            sessions = list(self._sessions.values())
            self._sessions.clear()
        while True:  # sessions closed while their "close" was still queued
            try:
                item = self._commands.get_nowait()
            except queue.Empty:
                break
            if isinstance(item, Close):
                sessions.append(item.session)
        for session in sessions:
            self._release(session)

    def __enter__(self) -> Engine:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------ EngineAPI (any thread)
    def create_session(
        self, prompt: str, seed: int | None = None, fps: int | None = None,
        history: tuple[np.ndarray, list[frozenset[str]]] | None = None,
    ) -> SessionInfo:
        """Admit a session; its backend state is made on the engine thread (a failure there
        ends the session with an error event). ``history``: recent frames ``(n, H, W, 3)``
        uint8 and the keys held for each (the backend maps them to its actions), fed to the model
        as context before the first chunk (a recache: restoring a session that lived elsewhere)
        when the backend has the optional ``observe(state, frames, actions)`` hook, in whole
        chunks. Raises CapacityError when ``max_sessions`` or the backend's state budget is reached,
        ValueError for a bad prompt, seed, fps or history."""
        check_prompt(prompt)
        if history is not None:
            history = check_history(self.backend, history)  # ValueError
        seed, fps = check_seed_and_fps(seed, fps, self.default_fps, self.config)  # ValueError
        if self._stop.is_set():
            raise RuntimeError("engine stopped")
        make = None
        if history is None and isinstance(self.backend, PreparesStates):
            # NOTE: made here, in the caller's thread (a crafter world: ~1 s): on the engine
            # thread it stalled every session's stream at each create
            with self._lock:
                self.scheduler.check_admit(len(self._sessions))  # CapacityError before the work
            make = self.backend.prepare_state(prompt, seed)
        if self._prompts is not None:  # encode it here, in the caller's thread, not on ours
            try:
                self.backend.prepare_prompt(prompt)
            except ValueError:
                pass  # the backend refuses it on the engine thread, with its own message
        cfg = self.config
        with self._lock:
            self.scheduler.admit(len(self._sessions))  # CapacityError
            session = Session(
                uuid.uuid4().hex, prompt, seed, fps=fps,
                chunk_frames=self.chunk_frames, created_ns=time.perf_counter_ns(),
                degrade=DegradeController(
                    self.default_steps, fps, min_steps=cfg.min_steps, min_fps=cfg.min_fps,
                    factor=cfg.fps_degrade_factor, misses=cfg.degrade_after_misses,
                    recover=cfg.recover_after_chunks, step_cost=self._step_cost),
                stats_window_s=cfg.metrics_window_s,
                idle_action=self.idle_action,
            )
            session.mode = cfg.mode
            session.inputs = InputLog({"kind": "prompt" if history is None else "history"},
                                      seed=seed, prompt=prompt, chunk_frames=self.chunk_frames,
                                      steps=session.steps, fps=fps)
            self._sessions[session.session_id] = session
        self._commands.put(Create(session, history, make))
        return SessionInfo(session.session_id, self.backend.width, self.backend.height, fps,
                           pixel_art=self.pixel_art)

    def _session(self, session_id: str) -> Session:
        session = self._sessions.get(session_id)
        if session is None or session.closed:
            raise SessionClosedError(session_id)
        return session

    def submit(self, session_id: str, command: Command) -> None:
        """Queue ``command``; its receipt time starts the action-to-frame measurement.
        Raises SessionClosedError for an unknown/closed session, TypeError for a non-command."""
        if not isinstance(command, _COMMAND_TYPES):
            raise TypeError(f"not an engine command: {type(command).__name__}")
        receipt_ns = time.perf_counter_ns()
        with self._lock:
            session = self._session(session_id)
        item = Apply(session, command, receipt_ns)
        if self._prompts is None:
            self._commands.put(item)
        else:
            self._prompts.submit(session_id, item)

    def subscribe(self, session_id: str, maxlen: int | None = None,
                  slot: FrameSlot | None = None) -> FrameSlot:
        """A new frame slot (or ``slot``: a subclass that renumbers, as a replica's local
        transports use) receiving every frame of the session from now on."""
        if slot is None:
            slot = FrameSlot(self.config.slot_maxlen if maxlen is None else maxlen)
        with self._lock:
            session = self._session(session_id)
            # also pruned on delivery; a paused session delivers nothing
            session.subscribers = [s for s in session.subscribers if not s.closed] + [slot]
        return slot

    def set_paused(self, session_id: str, paused: bool) -> None:
        """Pause (no chunks generated) or resume a session, e.g. while no viewer is attached.
        A resumed stream restarts its playout clock: the pause is not a deadline miss. Raises
        SessionClosedError for an unknown or closed session."""
        with self._lock:
            session = self._session(session_id)
        self._commands.put(Pause(session, bool(paused)))

    def events(self, session_id: str) -> EventQueue:
        with self._lock:
            return self._session(session_id).events

    def close_session(self, session_id: str) -> None:
        """End the session (its slots close, Event "closed"). Raises SessionClosedError when
        unknown or already closed."""
        with self._lock:
            session = self._session(session_id)
            session.closed = True
            del self._sessions[session_id]
            # NOTE: the budget comes back now, not when the engine thread frees the states:
            # commands run in order, so any later create or fork reaches the backend after
            # this close has freed them (a client reconnecting at once gets no spurious 503)
            self.scheduler.budget.release_all(session)
        if self._prompts is not None:
            self._prompts.forget(session_id)
        self._commands.put(Close(session))

    def num_sessions(self) -> int:
        with self._lock:
            return len(self._sessions)

    def metrics(self) -> dict[str, Any]:
        """Per-session and aggregate figures (JSON-ready). Per session: ``fps`` measured over
        ``metrics_window_s``, ``target_fps``, ``steps``, ``chunk_frames``, ``buffer_frames``
        (generated ahead of the playout clock), ``gen_ms_per_chunk`` (mean of recent batches),
        ``action_to_frame_ms`` (p50/p95/count, command receipt -> frame ready), ``degraded``,
        ``degrade_level``, ``dropped_frames`` (subscriber slots), ``subscribers`` (open slots),
        ``late_frames`` (frames the playout clock waited for), ``frames``."""
        now = time.perf_counter_ns()
        with self._lock:
            per_session = {sid: session_metrics(s, now) for sid, s in self._sessions.items()}
            return {
                "model": self.model_name,
                "num_sessions": len(self._sessions),
                "capacity": self.capacity,
                "aggregate_fps": sum(m["fps"] for m in per_session.values()),
                "batches": self._batches.num_batches,
                "mean_batch_size": (self._batches.num_jobs / self._batches.num_batches
                                    if self._batches.num_batches else 0.0),
                "sessions": per_session,
            }

    def latency_budget(self, session_id: str) -> dict[str, Any]:
        """The session's designed latency budget (JSON-ready): ``mode`` (None: custom),
        ``chunk_frames``, ``steps``, ``fps``, ``plan_ms`` (the chunk time it is planned with:
        p95 of recent chunks + ``jit_margin_ms``), ``wait_ms`` (mean wait of an action for the
        next chunk to start: half a chunk interval), ``floor_ms`` = wait + plan: the
        action-to-frame latency of these settings before any transport, and
        ``after_delivery_ms`` (mean of the backend's work after delivery, e.g. the cache fill:
        engine time, not on the action's path). Raises SessionClosedError."""
        with self._lock:
            s = self._session(session_id)
            return latency_budget(s, self.scheduler.plan_ms(s))

    # ------------------------------------------------------------ engine thread
    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._drain(self.scheduler.idle_timeout(
                    self._live(), time.perf_counter_ns(), _MAX_IDLE_S, _PREVIEW_POLL_NS))
                if self._stop.is_set():
                    break
                plan = self.scheduler.next_batch(self._live(), time.perf_counter_ns())
                if plan is not None:
                    self._batches.run(plan)
            except Exception:  # a bug must not silently stop every stream
                log.exception("engine loop error")

    def _live(self) -> list[Session]:
        with self._lock:
            return [s for s in self._sessions.values() if s.state is not None and not s.paused]

    def _drain(self, timeout: float) -> None:
        try:
            item = self._commands.get(timeout=timeout) if timeout > 0 else \
                self._commands.get_nowait()
        except queue.Empty:
            return
        while True:
            self._handle(item)
            try:
                item = self._commands.get_nowait()
            except queue.Empty:
                return

    def _handle(self, item: Item) -> None:
        match item:
            case Wake():
                return
            case Close(session):
                self._release(session)
                return
            case Call(session, fn, future):  # another module's work here (engine.studio.worldio)
                self._call(session, fn, future)
                return
        if item.session.closed:
            return
        session = item.session
        match item:
            case Pause(_, paused):
                with self._lock:  # metrics() reads the clock
                    if session.paused and not paused:
                        session.clock.started = False  # the next chunk starts it again
                        session.clock.anchor_ns = time.perf_counter_ns()
                    session.paused = paused
            case Create(_, history, make):
                try:
                    session.state = make() if make is not None else \
                        self.backend.new_state(session.prompt, session.seed)
                    if history is not None:
                        observe_history(self.backend, session.state, *history)
                except Exception as exc:  # CapacityError, ValueError, a backend failure
                    self._fail(session, f"could not create the session: {exc}")
            case Apply(_, command, receipt_ns):
                try:
                    self.commands.apply(session, command, receipt_ns)
                except InvalidCommand as exc:
                    session.emit("error", seq=command.seq, code=exc.code, field=exc.field,
                                 message=str(exc))
                except Exception as exc:
                    self._fail(session, f"{type(command).__name__} failed: {exc!r}")

    def call(self, session_id: str, fn: Callable[[Session], Any]) -> Future:
        """Run ``fn(session)`` on the engine thread between two batches (where no chunk of
        the session is being generated); its result or exception completes the returned
        future. Raises SessionClosedError for an unknown or closed session; a session that
        closes before its turn fails the future with SessionClosedError."""
        with self._lock:
            session = self._session(session_id)
        future: Future = Future()
        self._commands.put(Call(session, fn, future))
        return future

    def _call(self, session: Session, fn: Callable[[Session], Any], future: Future) -> None:
        if not future.set_running_or_notify_cancel():
            return
        if session.closed:
            future.set_exception(SessionClosedError(session.session_id))
            return
        try:
            future.set_result(fn(session))
        except Exception as exc:  # the caller's to report; the session goes on
            future.set_exception(exc)

    # ------------------------------------------------------------ endings
    def _fail(self, s: Session, message: str) -> None:
        """End one session after a failure; the others go on."""
        log.warning("session %s ended: %s", s.session_id, message)
        s.emit("error", code="session_failed", message=message)
        with self._lock:
            s.closed = True
            self._sessions.pop(s.session_id, None)
        self._release(s)

    def _release(self, s: Session) -> None:
        """Free the session's backend states, return its share of the state budget (including
        a reservation whose state was never made), close its slots and emit "closed" (engine
        thread, or after the thread stopped). Idempotent."""
        if self._prompts is not None:
            self._prompts.forget(s.session_id)
        states = [b.state for b in s.branches] + ([s.state] if s.state is not None else [])
        s.state, s.branches = None, []
        for state in states:
            try:
                self.backend.free(state)
            except Exception:
                log.exception("backend.free failed")
        with self._lock:
            s.closed = True
            self.scheduler.budget.release_all(s)
            slots, s.subscribers = s.subscribers, []
            first_release = not s.released
            s.released = True
        if first_release:
            s.emit("closed")
        for slot in slots:
            slot.close()
