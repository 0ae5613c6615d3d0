"""The front end's engine over replicas on Ray (issue 14): implements ``engine.core.api.EngineAPI``,
so the HTTP API, WebRTC, WebSocket, recording and the page work unchanged on top of it.

- **Placement**: a new session goes to the live replica with the fewest sessions (then the
  lowest measured chunk time); 503 (``CapacityError``) only when every replica is full.
- **Affinity**: a placement table maps each session to its replica's actor handle; every
  command of the session goes to that handle, in order (Ray keeps the order of one caller's
  calls to one actor).
- **Frames back**: one pump thread per replica long-polls ``EngineReplica.pull`` and hands
  the frames, with their metadata, to the session's local frame slots; times are translated to
  this process's clock (the smallest offset seen: a replica on another host has its own).
- **Failover**: every session keeps a :class:`~engine.cluster.journal.Journal`. When a
  replica dies, its sessions are re-created on a surviving replica (a new one is started if
  none has room) from the journal: same prompt and seed, the recent frames as context (a
  recache, where the backend can ``observe``), the settings and keys replayed; frame indices
  continue, so the same WebRTC track and recording go on. The session gets an event
  ``{"kind": "recovered"}``.
- **Autoscaling**: the replica count follows the live sessions between ``min_replicas`` and
  ``max_replicas`` (one replica per ``capacity`` sessions, plus room for the next user); a
  replica is stopped only after ``IDLE_BEFORE_STOP_S`` without a session.
"""

from __future__ import annotations

import contextlib
import logging
import math
import random
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Any

from worldstream.engine.cluster.journal import Journal
from worldstream.engine.cluster.replica import EngineReplica
from worldstream.engine.core.api import (
    CapacityError,
    Command,
    Event,
    EventQueue,
    FrameSlot,
    SessionClosedError,
    SessionInfo,
)
from worldstream.engine.core.config import EngineConfig
from worldstream.engine.studio.picture import PictureError
from worldstream.engine.studio.savepoint import SavepointError

log = logging.getLogger(__name__)

#: the longest a session creation waits for its replica, s
CREATE_TIMEOUT_S = 30.0
#: a replica idle this long may be stopped when there are more than wanted (no flapping), s
IDLE_BEFORE_STOP_S = 30.0


def _studio_error(reply: dict) -> Exception:
    """The local exception of a studio failure a replica sent back as data
    (``EngineReplica.studio``): the same class where the front end has it, its message."""
    name, message = reply["error"], reply["message"]
    if name == "CapacityError":
        return CapacityError(message, reply.get("retry_after_s") or 5.0)
    if name == "SessionClosedError":
        return SessionClosedError(message)
    known: dict[str, type[Exception]] = {"SavepointError": SavepointError,
                                         "PictureError": PictureError,
                                         "TimeoutError": TimeoutError}
    return known.get(name, ValueError)(message)


@dataclass
class _Replica:
    id: int
    handle: Any
    info: dict
    alive: bool = True
    sessions: set[str] = field(default_factory=set)  # public session ids placed here
    pending: int = 0  # sessions being created here right now
    failovers: int = 0  # sessions this replica took over from a dead one
    metrics: dict = field(default_factory=dict)
    offset_ns: int | None = None  # local perf_counter_ns minus the replica's
    idle_since: float | None = None  # monotonic s since it holds no session
    pump: threading.Thread | None = None


@dataclass
class _Routed:
    """A session as the front end sees it: where it lives, who watches, what to restore."""

    info: SessionInfo  # the public id and size
    replica: int
    remote_id: str
    journal: Journal
    slots: list[FrameSlot] = field(default_factory=list)
    events: EventQueue = field(default_factory=EventQueue)
    index_offset: int = 0  # public frame index = the replica's + this (continues on failover)
    next_index: int = 0


class RayEngine:
    """``EngineAPI`` over ``replicas`` engine replicas on Ray.

    Args:
        model: backend name of every replica (``builtin``, ``sim``, ``wan-causal``).
        replicas: replicas started at once; ``min_replicas``/``max_replicas`` bound the
            autoscaler (default: both ``replicas``, i.e. a fixed count).
        address: a Ray cluster to join (``ray start --head`` on one host, ``ray start
            --address`` on the others); None starts a local Ray in this process.
        config: the engine settings of every replica.
        model_kwargs: ``load_backend`` arguments (e.g. ``path``).
        replica_cpus, replica_gpus: Ray resources of one replica (``num_cpus``/``num_gpus``).
        threads: torch threads per replica.
        journal_frames: recent frames kept per session for a failover.
    Raises ValueError for bad counts; RuntimeError when a replica cannot start.
    """

    def __init__(self, model: str, *, replicas: int = 1, min_replicas: int | None = None,
                 max_replicas: int | None = None, address: str | None = None,
                 config: EngineConfig | None = None, model_kwargs: dict | None = None,
                 replica_cpus: float = 1.0, replica_gpus: float = 0.0,
                 threads: int | None = 1, journal_frames: int = 8,
                 monitor_period_s: float = 1.0):
        self.min_replicas = replicas if min_replicas is None else min_replicas
        self.max_replicas = max(replicas, self.min_replicas) if max_replicas is None \
            else max_replicas
        if not 1 <= self.min_replicas <= replicas <= self.max_replicas:
            raise ValueError(f"need 1 <= min_replicas ({self.min_replicas}) <= replicas "
                             f"({replicas}) <= max_replicas ({self.max_replicas})")
        self.config = config or EngineConfig()
        self._start_count = replicas
        self._model, self._model_kwargs, self._threads = model, model_kwargs or {}, threads
        self._address = address
        self._resources = {"num_cpus": replica_cpus, "num_gpus": replica_gpus}
        self._journal_frames = journal_frames
        self._monitor_period_s = monitor_period_s
        self._replicas: dict[int, _Replica] = {}
        self._sessions: dict[str, _Routed] = {}
        self._by_remote: dict[tuple[int, str], str] = {}
        self._lock = threading.RLock()
        self._stopping = threading.Event()
        self._next_replica = 0
        self._own_ray = False
        self._actor_cls: Any = None
        self._monitor: threading.Thread | None = None
        self.model_name = model
        self.capacity = 0

    # ------------------------------------------------------------ lifecycle
    def start(self) -> RayEngine:
        import ray

        if not ray.is_initialized():
            kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False,
                                      "configure_logging": False}
            if self._address is None:
                # room for every replica the autoscaler may start (and one replacing a dead
                # one) even on a small machine: replicas then share its cores
                import os

                need = (self.max_replicas + 1) * max(self._resources["num_cpus"], 1)
                kwargs["num_cpus"] = int(max(os.cpu_count() or 1, need))
                # NOTE: Ray starts its workers at nice 15 (``worker_niceness``) to keep its own
                # daemons responsive; a replica is a real-time server, and at nice 15 beside
                # two busy processes one took over 400 s to load (the SIGKILL failover test)
                # instead of 10. A cluster started elsewhere needs RAY_worker_niceness=0.
                kwargs["_system_config"] = {"worker_niceness": 0}
            ray.init(address=self._address, **kwargs)
            self._own_ray = True
        # NOTE: commands run in the default concurrency group, one thread: Ray executes one
        # caller's calls in submission order only there (in a threaded group a pause and the
        # resume right after it could swap). The long poll and the metrics get a group of
        # their own, so they never wait behind a command nor block one.
        self._actor_cls = ray.remote(concurrency_groups={"poll": 2, "studio": 1})(
            EngineReplica).options(
            max_restarts=0, **self._resources)
        started = [self._launch() for _ in range(self._start_count)]
        for rep in started:
            self._await_ready(rep)
        first = started[0].info
        self.model_name = first["model"]
        self.capacity = self.max_replicas * first["capacity"]
        self._monitor = threading.Thread(target=self._monitor_loop, name="ray-monitor",
                                         daemon=True)
        self._monitor.start()
        return self

    def _launch(self) -> _Replica:
        handle = self._actor_cls.remote(self._model, self.config, self._model_kwargs,
                                        self._threads)
        with self._lock:
            rep = _Replica(self._next_replica, handle, {})
            self._next_replica += 1
        return rep

    def _await_ready(self, rep: _Replica, timeout_s: float = 600) -> None:
        import ray

        try:
            rep.info = ray.get(rep.handle.describe.remote(), timeout=timeout_s)
        except Exception as err:
            ray.kill(rep.handle)
            raise RuntimeError(f"engine replica {rep.id} did not start: {err}") from err
        rep.pump = threading.Thread(target=self._pump, args=(rep,), name=f"ray-pump-{rep.id}",
                                    daemon=True)
        with self._lock:
            self._replicas[rep.id] = rep
        rep.pump.start()

    def stop(self) -> None:
        """Close every session, stop the replicas (and the local Ray this started)."""
        import ray

        self._stopping.set()
        for session_id in list(self._sessions):
            with contextlib.suppress(SessionClosedError):  # closed meanwhile
                self.close_session(session_id)
        with self._lock:
            replicas = list(self._replicas.values())
        for rep in replicas:
            rep.alive = False
            try:
                ray.get(rep.handle.stop.remote(), timeout=10)
            except Exception:  # already dead
                pass
            ray.kill(rep.handle)
        for rep in replicas:
            if rep.pump is not None:
                rep.pump.join(5)
        if self._monitor is not None:
            self._monitor.join(5)
        if self._own_ray:
            ray.shutdown()

    def __enter__(self) -> RayEngine:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------ placement
    def _live(self) -> list[_Replica]:
        with self._lock:
            return [r for r in self._replicas.values() if r.alive]

    def _place(self, exclude: int | None = None) -> _Replica | None:
        """The live replica with room and the fewest sessions (then the fastest chunks)."""
        candidates = [r for r in self._live() if r.id != exclude
                      and len(r.sessions) + r.pending < r.info["capacity"]]
        if not candidates:
            return None
        return min(candidates, key=lambda r: (len(r.sessions) + r.pending,
                                              r.metrics.get("chunk_ms_p50") or 0.0, r.id))

    # ------------------------------------------------------------ EngineAPI
    def create_session(self, prompt: str, seed: int | None = None,
                       fps: int | None = None) -> SessionInfo:
        """Place a session; CapacityError (HTTP 503) when every replica is full, ValueError
        for a bad prompt, seed or fps (from the replica)."""
        import ray

        seed = random.randrange(2**31) if seed is None else seed
        with self._lock:
            rep = self._place()
            if rep is None:
                raise CapacityError(f"all {len(self._live())} replicas are full",
                                    self.config.retry_after_s)
            rep.pending += 1  # hold its place while the replica creates the session
        try:
            info = ray.get(rep.handle.create_session.remote(prompt, seed, fps),
                           timeout=CREATE_TIMEOUT_S)
        except ray.exceptions.RayTaskError as err:  # the replica refused: its own error
            cause = err.cause
            if isinstance(cause, CapacityError | ValueError):
                raise type(cause)(*cause.args) from None
            raise CapacityError(f"the replica failed to create the session ({cause!r})",
                                self.config.retry_after_s) from None
        except ray.exceptions.RayError:  # died or hangs: its pump fails it over
            raise CapacityError("an engine replica is unavailable; try again",
                                self.config.retry_after_s) from None
        finally:
            with self._lock:
                rep.pending -= 1
        public = SessionInfo(info.session_id, info.width, info.height, info.fps)
        journal = Journal(prompt, seed, info.fps, self._journal_frames)
        with self._lock:
            self._sessions[info.session_id] = _Routed(public, rep.id, info.session_id, journal)
            self._by_remote[(rep.id, info.session_id)] = info.session_id
            rep.sessions.add(info.session_id)
        return public

    def _routed(self, session_id: str) -> _Routed:
        with self._lock:
            routed = self._sessions.get(session_id)
        if routed is None:
            raise SessionClosedError(session_id)
        return routed

    def _handle_of(self, routed: _Routed) -> Any:
        with self._lock:
            return self._replicas[routed.replica].handle

    def submit(self, session_id: str, command: Command) -> None:
        routed = self._routed(session_id)
        routed.journal.record_command(command)
        self._handle_of(routed).submit.remote(routed.remote_id, command)

    def subscribe(self, session_id: str, maxlen: int | None = None) -> FrameSlot:
        slot = FrameSlot(self.config.slot_maxlen if maxlen is None else maxlen)
        routed = self._routed(session_id)
        with self._lock:
            routed.slots = [s for s in routed.slots if not s.closed] + [slot]
        return slot

    def events(self, session_id: str) -> EventQueue:
        return self._routed(session_id).events

    def studio(self, op: str, session_id: str, *args: Any) -> Future:
        """Studio operation ``op`` (``EngineReplica.STUDIO_OPS``: ``export_log``, ``save``,
        ``load``, ``start_from_picture``, ``play_story``) on the session's replica, as the
        ``engine.studio.worldio`` function of that name does on a local engine: a future of
        its result, failing with the same error class (SavepointError, PictureError,
        CapacityError, SessionClosedError, ValueError, TimeoutError) and message.
        SessionClosedError at once for an unknown session."""
        routed = self._routed(session_id)
        ref = self._handle_of(routed).studio.options(concurrency_group="studio").remote(
            op, routed.remote_id, *args)
        out: Future = Future()

        def done(f: Future) -> None:
            try:
                reply = f.result()
            except Exception as err:  # the replica died during the call
                out.set_exception(TimeoutError(f"the session's replica failed ({err!r})"))
                return
            if "error" in reply:
                out.set_exception(_studio_error(reply))
            else:
                out.set_result(reply["value"])

        ref.future().add_done_callback(done)
        return out

    def set_paused(self, session_id: str, paused: bool) -> None:
        routed = self._routed(session_id)
        routed.journal.paused = paused
        self._handle_of(routed).set_paused.remote(routed.remote_id, paused)

    def close_session(self, session_id: str) -> None:
        with self._lock:
            routed = self._sessions.pop(session_id, None)
            if routed is None:
                raise SessionClosedError(session_id)
            self._by_remote.pop((routed.replica, routed.remote_id), None)
            rep = self._replicas.get(routed.replica)
            if rep is not None:
                rep.sessions.discard(session_id)
            slots, routed.slots = routed.slots, []
        if rep is not None and rep.alive:
            rep.handle.close_session.remote(routed.remote_id)
        routed.events.put(Event("closed", {}))
        for slot in slots:
            slot.close()

    def num_sessions(self) -> int:
        with self._lock:
            return len(self._sessions)

    def latency_budget(self, session_id: str) -> dict[str, Any]:
        """The session's budget as its replica last reported it (refreshed every second)."""
        routed = self._routed(session_id)
        with self._lock:
            rep = self._replicas.get(routed.replica)
            budget = (rep.metrics.get("budgets") or {}).get(routed.remote_id) if rep else None
        return budget or {"mode": None, "chunk_frames": None, "steps": None,
                          "fps": routed.info.fps, "plan_ms": None, "wait_ms": None,
                          "floor_ms": None, "after_delivery_ms": None}

    def metrics(self) -> dict[str, Any]:
        """The engine's metrics merged over replicas (sessions by their public ids), plus
        ``replicas``: ``id``, ``pid``, ``node``, ``alive``, ``sessions`` (public ids),
        ``chunk_ms_p50``, ``chunk_ms_p95``, ``failovers``, ``received`` (commands per
        session, by public id: the affinity check)."""
        with self._lock:
            replicas, sessions = list(self._replicas.values()), dict(self._sessions)
            public = dict(self._by_remote)
        per_session, listed = {}, []
        for rep in replicas:
            m = rep.metrics
            for remote_id, sm in (m.get("sessions") or {}).items():
                sid = public.get((rep.id, remote_id))
                if sid is not None:
                    per_session[sid] = sm
            listed.append({
                "id": rep.id, "pid": rep.info.get("pid"), "node": rep.info.get("node"),
                "alive": rep.alive, "sessions": sorted(rep.sessions),
                "chunk_ms_p50": m.get("chunk_ms_p50"), "chunk_ms_p95": m.get("chunk_ms_p95"),
                "failovers": rep.failovers,
                "received": {public[(rep.id, r)]: n for r, n in (m.get("received") or {}).items()
                             if (rep.id, r) in public}})
        return {"model": self.model_name, "num_sessions": len(sessions),
                "capacity": self.capacity,
                "aggregate_fps": sum(m.get("fps") or 0.0 for m in per_session.values()),
                "sessions": per_session, "replicas": listed}

    # ------------------------------------------------------------ frames back
    def _pump(self, rep: _Replica) -> None:
        import ray

        while not self._stopping.is_set() and rep.alive:
            try:
                reply = ray.get(rep.handle.pull.options(concurrency_group="poll").remote(0.05),
                                timeout=60)
            except Exception as err:  # RayActorError (the process died), a timeout, ...
                if self._stopping.is_set() or not rep.alive:
                    return
                log.warning("engine replica %d (pid %s) failed: %r", rep.id,
                            rep.info.get("pid"), err)
                self._failover(rep)
                return
            offset = time.perf_counter_ns() - reply["now_ns"]
            rep.offset_ns = offset if rep.offset_ns is None else min(rep.offset_ns, offset)
            self._deliver(rep, reply)

    def _deliver(self, rep: _Replica, reply: dict) -> None:
        off = rep.offset_ns or 0
        for frame in reply["frames"]:
            with self._lock:
                sid = self._by_remote.get((rep.id, frame.session_id))
                routed = self._sessions.get(sid) if sid else None
                if routed is None:
                    continue
                routed.slots = [s for s in routed.slots if not s.closed]
                slots = list(routed.slots)
                index = frame.index + routed.index_offset
                routed.next_index = index + 1
            routed.journal.record_frame(frame.rgb, frame.action_seq)
            public = replace(frame, session_id=sid, index=index,
                             t_ready_ns=frame.t_ready_ns + off,
                             present_ns=frame.present_ns + off)
            for slot in slots:
                slot.put(public)
        for remote_id, event in reply["events"]:
            with self._lock:
                sid = self._by_remote.get((rep.id, remote_id))
                routed = self._sessions.get(sid) if sid else None
            if routed is not None and event.kind != "closed":
                routed.events.put(event)
        for remote_id in reply["closed"]:  # ended on the replica (a failure), not by us
            with self._lock:
                sid = self._by_remote.get((rep.id, remote_id))
            if sid is not None:
                try:
                    self.close_session(sid)
                except SessionClosedError:
                    pass

    # ------------------------------------------------------------ failover
    def _failover(self, dead: _Replica) -> None:
        """Re-create the dead replica's sessions elsewhere from their journals."""
        import ray

        with self._lock:
            dead.alive = False
            moved = [(sid, self._sessions[sid]) for sid in dead.sessions if sid in
                     self._sessions]
            dead.sessions = set()
        with contextlib.suppress(Exception):  # a hung replica must not go on generating
            ray.kill(dead.handle)
        for sid, routed in moved:
            target = self._place(exclude=dead.id)
            if target is None and len(self._live()) < self.max_replicas + 1:
                target = self._launch()  # a replacement (allowed one over the maximum)
                try:
                    self._await_ready(target)
                except RuntimeError:
                    target = None
            if target is None:
                routed.events.put(Event("error", {"code": "session_failed",
                                                  "message": "its engine replica died and "
                                                             "no other has room"}))
                with contextlib.suppress(SessionClosedError):  # the user may have closed it
                    self.close_session(sid)
                continue
            journal = routed.journal
            try:
                info = ray.get(target.handle.create_session.remote(
                    journal.prompt, journal.seed, journal.fps, journal.history()), timeout=120)
            except Exception as err:
                routed.events.put(Event("error", {"code": "session_failed",
                                                  "message": f"recovery failed: {err!r}"}))
                with contextlib.suppress(SessionClosedError):
                    self.close_session(sid)
                continue
            for command in journal.replay():
                target.handle.submit.remote(info.session_id, command)
            if journal.paused:
                target.handle.set_paused.remote(info.session_id, True)
            with self._lock:
                closed_meanwhile = sid not in self._sessions
                if not closed_meanwhile:
                    self._by_remote.pop((dead.id, routed.remote_id), None)
                    routed.replica, routed.remote_id = target.id, info.session_id
                    routed.index_offset = routed.next_index
                    self._by_remote[(target.id, info.session_id)] = sid
                    target.sessions.add(sid)
                    target.failovers += 1
            if closed_meanwhile:  # a DELETE came while it was being re-created
                target.handle.close_session.remote(info.session_id)
                continue
            routed.events.put(Event("recovered", {"replica": target.id,
                                                  "from_replica": dead.id,
                                                  "context_frames": len(journal.frames)}))
            log.warning("session %s recovered on replica %d", sid, target.id)

    # ------------------------------------------------------------ monitor and autoscale
    def _monitor_loop(self) -> None:
        import ray

        while not self._stopping.wait(self._monitor_period_s):
            for rep in self._live():
                try:
                    rep.metrics = ray.get(
                        rep.handle.metrics.options(concurrency_group="poll").remote(),
                        timeout=10)
                except Exception:  # a dead replica: its pump fails it over
                    pass
            try:
                self._autoscale()
            except Exception as err:  # a replica that will not start or stop: try again
                log.warning("autoscaling: %r", err)

    def desired_replicas(self) -> int:
        """One replica per ``capacity`` live sessions plus room for the next user, within
        ``[min_replicas, max_replicas]``."""
        live = self._live()
        per = live[0].info["capacity"] if live else 1
        want = math.ceil((self.num_sessions() + 1) / max(per, 1))
        return min(max(want, self.min_replicas), self.max_replicas)

    def _autoscale(self) -> None:
        import ray

        live, want = self._live(), self.desired_replicas()
        now = time.monotonic()
        for rep in live:
            if rep.sessions or rep.pending:
                rep.idle_since = None
            elif rep.idle_since is None:
                rep.idle_since = now
        if len(live) < want:
            self._await_ready(self._launch())
            return
        with self._lock:  # an idle replica, idle for a while, with no creation in flight
            idle = [r for r in live if not r.sessions and not r.pending
                    and r.idle_since is not None and now - r.idle_since >= IDLE_BEFORE_STOP_S]
            if len(live) <= want or not idle:
                return
            rep = idle[-1]
            rep.alive = False
            del self._replicas[rep.id]
        try:
            ray.get(rep.handle.stop.remote(), timeout=10)
        finally:
            ray.kill(rep.handle)
