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
- **Autoscaling** (``engine.cluster.scaling``): the replica count follows the live sessions
  between ``min_replicas`` and ``max_replicas`` (one replica per ``capacity`` sessions, plus
  room for the next user); a surplus replica is drained (no new session, its sessions left
  to end or moved from their journals) before it stops: a scale-down ends no session.
- **Media from the replicas** (``replica_cls`` with ``media_answer``, e.g.
  ``streaming.replica_media.MediaReplica``): a session's WebRTC peer lives in its replica's
  process and sends from that host; this front end only relays the offer and answer
  (:meth:`RayEngine.media_answer`), and frames come here only when something here needs them
  (a recording, a WebSocket viewer, a journal that re-caches). What the replica's transport
  tells the front end (commands for the journal, transports opened and closed, activity,
  recording asks) comes back with the pulls as notes, handed to ``note_handler``.
- **Health** (``engine.cluster.health``): a replica that stops answering or stops running
  chunks for its sessions for ``hang_after_s`` is failed over like a dead one; hosts joining
  and leaving the cluster are logged.
"""

from __future__ import annotations

import contextlib
import logging
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from worldstream.engine.cluster import delivery, health, media_calls, scaling
from worldstream.engine.cluster.failover import fail_over
from worldstream.engine.cluster.journal import Journal
from worldstream.engine.cluster.placement import Replica, RoutedSession, wanted_replicas
from worldstream.engine.cluster.pool import ReplicaPool, init_ray
from worldstream.engine.cluster.replica import EngineReplica
from worldstream.engine.cluster.replies import merge_metrics, studio_future
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

log = logging.getLogger("worldstream.engine.cluster")

#: the longest a session creation (or a media offer) waits for its replica, s
CREATE_TIMEOUT_S = 30.0
#: how often the hosts of the cluster are listed (joins and losses logged), s
HOSTS_PERIOD_S = 5.0


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
        monitor_period_s: how often metrics, autoscaling and health are looked at, s.
        replica_cls, replica_kwargs: the actor class and its extra arguments
            (``pool.ReplicaPool``); a class with ``media_answer`` sends media itself.
        hang_after_s: silence after which a replica is failed over (``health.HANG_AFTER_S``).
        scale_down_after_s, drain_s: a surplus this long before a replica drains, and how
            long its sessions may end by themselves before they move, s (``scaling``).
    Raises ValueError for bad counts; ConnectionError when ``address`` does not answer;
    RuntimeError when a replica cannot start.
    """

    def __init__(self, model: str, *, replicas: int = 1, min_replicas: int | None = None,
                 max_replicas: int | None = None, address: str | None = None,
                 config: EngineConfig | None = None, model_kwargs: dict | None = None,
                 replica_cpus: float = 1.0, replica_gpus: float = 0.0,
                 threads: int | None = 1, journal_frames: int = 8,
                 monitor_period_s: float = 1.0, replica_cls: type = EngineReplica,
                 replica_kwargs: dict | None = None,
                 hang_after_s: float = health.HANG_AFTER_S,
                 scale_down_after_s: float = scaling.SCALE_DOWN_AFTER_S,
                 drain_s: float = scaling.DRAIN_S):
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
                                 self._resources, self._lock, replica_cls, replica_kwargs)
        self.media_on_replicas = replica_cls.serves_media
        #: called (public session id, note) for each note a replica's transport sends
        self.note_handler: Callable[[str, dict], None] | None = None
        self._hang_after_s = hang_after_s
        self._scaler = scaling.Scaler(scale_down_after_s, drain_s)
        # NOTE: with media on the replicas a pull rarely carries frames; a longer poll costs
        # the front end fewer round trips (it returns at once when anything comes)
        self._pull_s = 0.5 if self.media_on_replicas else 0.05
        self._hosts = health.HostWatch()
        self._replicas = self._pool.replicas  # the same dict: by id
        self._sessions: dict[str, RoutedSession] = {}
        self._by_remote: dict[tuple[int, str], str] = {}
        self._stopping = threading.Event()
        self._own_ray = False
        self._monitor: threading.Thread | None = None
        self.model_name = model
        self.capacity = 0
        self.world, self.wire_keys, self.controls, self.mouse = "landscape", None, None, False
        self.pixel_art = False

    # ------------------------------------------------------------ lifecycle
    def start(self) -> RayEngine:
        self._own_ray = init_ray(self._address, self.max_replicas, self._resources)
        self._pool.open()
        started = [self._pool.launch() for _ in range(self._start_count)]
        for rep in started:
            self._pool.await_ready(rep, self._pump)
        first = started[0].info
        self.model_name = first["model"]
        # what the page and the wire need of the model (its keys, whether it takes the mouse)
        self.world, self.wire_keys = first["world"], first["wire_keys"]
        self.controls, self.mouse = first["controls"], first["mouse"]
        self.pixel_art = first["pixel_art"]
        self.capacity = self.max_replicas * first["capacity"]
        self._watch_hosts()
        log.info("%d engine replica(s) on %s; media from %s", len(started),
                 ", ".join(sorted({r.host for r in started})),
                 "the replicas' hosts" if self.media_on_replicas else "this front end")
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
        public = SessionInfo(info.session_id, info.width, info.height, info.fps,
                             pixel_art=info.pixel_art)
        journal = Journal(prompt, seed, info.fps, self._journal_frames)
        with self._lock:
            self._sessions[info.session_id] = RoutedSession(
                public, rep.id, info.session_id, journal, forwarding=not self.media_on_replicas)
            self._by_remote[(rep.id, info.session_id)] = info.session_id
            rep.sessions.add(info.session_id)
        self._sync_forwarding(info.session_id)
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
        self._sync_forwarding(session_id)
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

    def media_answer(self, session_id: str, sdp: str,
                     timeout_s: float = CREATE_TIMEOUT_S) -> dict[str, str]:
        """The answer of the session's replica to a WebRTC offer: ``{"sdp", "type"}`` of its
        peer connection, with ICE candidates on that replica's host, or its refusal as data
        ``{"error": class name, "message"}`` (a bad offer, too many peer connections: the
        transport raises its own errors). A session whose replica is being replaced waits for
        the new one (up to ``timeout_s``). Raises SessionClosedError, TimeoutError."""
        return media_calls.call(self, session_id, "media_answer", (sdp,), timeout_s)

    def media_websocket(self, session_id: str, token: str, origins: tuple[str, ...],
                        timeout_s: float = CREATE_TIMEOUT_S) -> dict:
        """Where the session's replica serves its WebSocket fallback, for ``token`` from pages
        of ``origins``: ``{"url"}`` or the refusal as data (``MediaReplica.media_websocket``).
        Raises as :func:`~engine.cluster.media_calls.call`."""
        return media_calls.call(self, session_id, "media_websocket", (token, origins),
                                timeout_s)

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

    def refresh(self) -> None:
        """Fetch every live replica's metrics now (:meth:`metrics` shows the last fetched,
        at most ``monitor_period_s`` old)."""
        self._pool.refresh_metrics()

    def metrics(self) -> dict[str, Any]:
        """The engine's metrics merged over replicas (sessions by their public ids), plus
        ``replicas``: ``id``, ``pid``, ``node``, ``host`` (its address in the cluster),
        ``alive``, ``draining`` (taking no new session), ``sessions`` (public ids),
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
        delivery.pump(self, rep)

    def _notify(self, session_id: str, note: dict) -> None:
        delivery.notify(self, session_id, note)

    def _sync_forwarding(self, session_id: str) -> None:
        delivery.sync_forwarding(self, session_id)

    # ------------------------------------------------------------ monitor and autoscale
    def _monitor_loop(self) -> None:
        next_hosts = time.monotonic() + HOSTS_PERIOD_S
        while not self._stopping.wait(self._monitor_period_s):
            now = time.monotonic()
            fresh = self._pool.refresh_metrics()
            for rep in self._pool.live():
                if rep.id in fresh:  # stale metrics say nothing about progress
                    health.note_metrics(rep, rep.metrics, now)
                why = health.silent(rep, now, self._hang_after_s)
                if why is not None:  # hung: its pump may be blocked on it, so fail over here
                    threading.Thread(target=fail_over, args=(self, rep, f"hung: {why}"),
                                     name=f"failover-{rep.id}", daemon=True).start()
            if now >= next_hosts:
                next_hosts = now + HOSTS_PERIOD_S
                self._watch_hosts()
            try:
                self._scaler.step(self, now)
            except Exception as err:  # a replica that will not start or stop: try again
                log.warning("autoscaling: %r", err)

    def _watch_hosts(self) -> None:
        import ray

        try:
            alive = {n["NodeManagerAddress"] for n in ray.nodes() if n.get("Alive")}
        except Exception as err:  # the GCS is briefly unreachable: next time
            log.warning("listing the Ray cluster's hosts failed: %r", err)
            return
        self._hosts.update(alive)

    def desired_replicas(self) -> int:
        """One replica per ``capacity`` live sessions plus room for the next user, within
        ``[min_replicas, max_replicas]``."""
        return wanted_replicas(self._pool.live(), self.num_sessions(), self.min_replicas,
                               self.max_replicas)
