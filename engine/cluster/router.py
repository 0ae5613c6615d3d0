"""The front end's engine over replicas on Ray: implements ``engine.core.api.EngineAPI``,
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
  replica is stopped only after ``placement.IDLE_BEFORE_STOP_S`` without a session.
"""

from __future__ import annotations

import contextlib
import logging
import random
import threading
import time
from concurrent.futures import Future
from typing import Any

from worldstream.engine.cluster.journal import Journal
from worldstream.engine.cluster.placement import Replica, RoutedSession, wanted_replicas
from worldstream.engine.cluster.pool import ReplicaPool, init_ray
from worldstream.engine.cluster.replies import merge_metrics, public_frame, studio_future
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

log = logging.getLogger(__name__)

#: the longest a session creation waits for its replica, s
CREATE_TIMEOUT_S = 30.0


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
        self._address = address
        self._resources = {"num_cpus": replica_cpus, "num_gpus": replica_gpus}
        self._journal_frames = journal_frames
        self._monitor_period_s = monitor_period_s
        self._lock = threading.RLock()
        self._pool = ReplicaPool(model, self.config, model_kwargs or {}, threads,
                                 self._resources, self._lock)
        self._replicas = self._pool.replicas  # the same dict: by id
        self._sessions: dict[str, RoutedSession] = {}
        self._by_remote: dict[tuple[int, str], str] = {}
        self._stopping = threading.Event()
        self._own_ray = False
        self._monitor: threading.Thread | None = None
        self.model_name = model
        self.capacity = 0

    # ------------------------------------------------------------ lifecycle
    def start(self) -> RayEngine:
        self._own_ray = init_ray(self._address, self.max_replicas, self._resources)
        self._pool.open()
        started = [self._pool.launch() for _ in range(self._start_count)]
        for rep in started:
            self._pool.await_ready(rep, self._pump)
        first = started[0].info
        self.model_name = first["model"]
        self.capacity = self.max_replicas * first["capacity"]
        self._monitor = threading.Thread(target=self._monitor_loop, name="ray-monitor",
                                         daemon=True)
        self._monitor.start()
        return self

    def stop(self) -> None:
        """Close every session, stop the replicas (and the local Ray this started)."""
        import ray

        self._stopping.set()
        for session_id in list(self._sessions):
            with contextlib.suppress(SessionClosedError):  # closed meanwhile
                self.close_session(session_id)
        self._pool.stop_all()
        if self._monitor is not None:
            self._monitor.join(5)
        if self._own_ray:
            ray.shutdown()

    def __enter__(self) -> RayEngine:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------ EngineAPI
    def create_session(self, prompt: str, seed: int | None = None,
                       fps: int | None = None) -> SessionInfo:
        """Place a session; CapacityError (HTTP 503) when every replica is full, ValueError
        for a bad prompt, seed or fps (from the replica)."""
        import ray

        seed = random.randrange(2**31) if seed is None else seed
        with self._lock:
            rep = self._pool.place()
            if rep is None:
                raise CapacityError(f"all {len(self._pool.live())} replicas are full",
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
            self._sessions[info.session_id] = RoutedSession(public, rep.id, info.session_id,
                                                            journal)
            self._by_remote[(rep.id, info.session_id)] = info.session_id
            rep.sessions.add(info.session_id)
        return public

    def _routed(self, session_id: str) -> RoutedSession:
        with self._lock:
            routed = self._sessions.get(session_id)
        if routed is None:
            raise SessionClosedError(session_id)
        return routed

    def _handle_of(self, routed: RoutedSession) -> Any:
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
        return studio_future(self._handle_of(routed).studio.options(
            concurrency_group="studio").remote(op, routed.remote_id, *args))

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
        per_session, listed = merge_metrics(replicas, public)
        return {"model": self.model_name, "num_sessions": len(sessions),
                "capacity": self.capacity,
                "aggregate_fps": sum(m.get("fps") or 0.0 for m in per_session.values()),
                "sessions": per_session, "replicas": listed}

    # ------------------------------------------------------------ frames back
    def _pump(self, rep: Replica) -> None:
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

    def _deliver(self, rep: Replica, reply: dict) -> None:
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
            public = public_frame(frame, sid, index, off)
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
    def _failover(self, dead: Replica) -> None:
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
            target = self._pool.place(exclude=dead.id)
            if target is None and len(self._pool.live()) < self.max_replicas + 1:
                target = self._pool.launch()  # a replacement (allowed one over the maximum)
                try:
                    self._pool.await_ready(target, self._pump)
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
        while not self._stopping.wait(self._monitor_period_s):
            self._pool.refresh_metrics()
            try:
                self._pool.autoscale(self.desired_replicas(), self._pump)
            except Exception as err:  # a replica that will not start or stop: try again
                log.warning("autoscaling: %r", err)

    def desired_replicas(self) -> int:
        """One replica per ``capacity`` live sessions plus room for the next user, within
        ``[min_replicas, max_replicas]``."""
        return wanted_replicas(self._pool.live(), self.num_sessions(), self.min_replicas,
                               self.max_replicas)
