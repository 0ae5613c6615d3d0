"""The engine replicas as Ray actors: starting Ray sized for them, launching one and waiting
until it serves, polling their metrics, and stopping them (how many there should be is
``engine.cluster.scaling``'s)."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable, MutableMapping
from typing import Any

from worldstream.engine.cluster.placement import Replica, place
from worldstream.engine.cluster.replica import EngineReplica
from worldstream.engine.core.config import EngineConfig

log = logging.getLogger("worldstream.engine.cluster")

#: the Ray namespace of worldstream's replicas (named ``ws-replica-<front end>-<n>`` in it)
NAMESPACE = "worldstream"
#: how long a failed actor call waits for the cause of its actor's death, ms (see init_ray)
DEATH_INFO_WAIT_MS = 100
#: how long a Ray address may take to accept a TCP connection before it is reported dead, s
CONNECT_TIMEOUT_S = 5.0
#: the node address of a Ray started here: its head, raylet and workers listen on loopback only
LOCAL_NODE_ADDRESS = "127.0.0.1"


def check_address(address: str, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """ConnectionError (one line naming the address and what to do) unless ``HOST:PORT``
    accepts a TCP connection within ``timeout_s``; ``auto`` and ``ray://`` addresses are
    left to Ray. NOTE: ``ray.init`` on an address that does not answer retries for about a
    minute and then fails with a message about the GCS; this says it in seconds."""
    if address == "auto" or "://" in address:
        return
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host or address, int(port or 6379)), timeout_s).close()
    except (OSError, ValueError) as err:
        raise ConnectionError(
            f"the Ray cluster at {address} does not answer ({err}); start its head there "
            "(`ray start --head`) or pass the right --ray-address") from None


def _is_loopback_host(host: str) -> bool:
    host = host.strip("[]")
    return host == "localhost" or host == "::1" or host.startswith("127.")


def require_token_auth(address: str, environ: MutableMapping[str, str] = os.environ
                       ) -> None:
    """Joining the Ray cluster at ``address`` (``HOST:PORT``) on another host: turn Ray's token
    authentication on (``RAY_AUTH_MODE=token`` when unset; Ray then reads the shared token
    from ``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH`` or ``~/.ray/auth_token``). ConnectionError
    when it was turned off: without it anyone who reaches the cluster's ports runs code in
    it. A loopback address, ``auto`` and ``ray://`` are left to Ray."""
    if address == "auto" or "://" in address:
        return
    host = address.rpartition(":")[0] or address
    if _is_loopback_host(host):
        return
    mode = environ.setdefault("RAY_AUTH_MODE", "token")
    if mode.lower() != "token":
        raise ConnectionError(
            f"joining the Ray cluster at {address} needs Ray's token authentication, but "
            f"RAY_AUTH_MODE={mode}: set RAY_AUTH_MODE=token and the cluster's token "
            "(RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH) here and on every host")
    with contextlib.suppress(ImportError, AttributeError):
        from ray._raylet import Config

        Config.initialize("")  # Ray caches its settings: read RAY_AUTH_MODE again


@contextlib.contextmanager
def _loopback_node():
    """While it is held, Ray keeps a loopback node address as it is.

    NOTE: Ray's C++ servers (GCS, raylet, each worker's) listen on every interface unless the
    node's address is 127.0.0.1, and ``ray.init`` replaces a loopback ``_node_ip_address``
    with the machine's network address (``services.resolve_ip_for_localhost``), except where
    Ray clusters are off (macOS, Windows: ``ray_constants.ENABLE_RAY_CLUSTER``). A Ray
    started by the front end only ever has this host's replicas: it turns that off for the
    start, so every listener of the cluster is on loopback (issue 64)."""
    from ray._private import ray_constants

    before = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = before


def init_ray(address: str | None, max_replicas: int, resources: dict[str, float]) -> bool:
    """Join ``address`` (None: start a local Ray, listening on loopback only) unless Ray is up
    already; True when this call started it (the caller then shuts it down).
    ConnectionError when ``address`` does not answer (:func:`check_address`) or would be
    joined without token authentication (:func:`require_token_auth`)."""
    import ray

    if ray.is_initialized():
        return False
    if address is not None:
        check_address(address)
        require_token_auth(address)
    # NOTE: a call to an actor whose connection closes waits this long for the cluster to
    # say why before it fails (Ray's default 1 s). When a whole host goes, nobody says: its
    # raylet is gone too, and the head learns only after missed health checks (~15 s). The
    # closed connection is the news: fail the call at once, so the failover starts at once.
    # Read by this process's Ray core worker only (the replicas keep the default).
    os.environ.setdefault("RAY_timeout_ms_task_wait_for_death_info", str(DEATH_INFO_WAIT_MS))
    kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False,
                              "configure_logging": False, "namespace": NAMESPACE}
    if address is None:
        # room for every replica the autoscaler may start (and one replacing a dead
        # one) even on a small machine: replicas then share its cores
        need = (max_replicas + 1) * max(resources["num_cpus"], 1)
        kwargs["num_cpus"] = int(max(os.cpu_count() or 1, need))
        # NOTE: Ray starts its workers at nice 15 (``worker_niceness``) to keep its own
        # daemons responsive; a replica is a real-time server and starves at nice 15 beside
        # busy processes. A cluster started elsewhere needs RAY_worker_niceness=0.
        kwargs["_system_config"] = {"worker_niceness": 0}
        kwargs["_node_ip_address"] = LOCAL_NODE_ADDRESS
        with _loopback_node():
            ray.init(**kwargs)
        return True
    try:
        ray.init(address=address, **kwargs)
    except ray.exceptions.AuthenticationError as err:  # no token, or not the cluster's
        raise ConnectionError(f"the Ray cluster at {address} refused this front end: "
                              f"{' '.join(str(err).split())}") from None
    return True


class ReplicaPool:
    """The replicas of one router, by id (``replicas``, guarded by ``lock``, the router's).

    Args:
        model, config, model_kwargs, threads: what every replica loads and runs.
        resources: Ray resources of one replica (``num_cpus``, ``num_gpus``).
        lock: the router's lock.
        replica_cls: the actor's class (``EngineReplica`` or a subclass adding a transport,
            e.g. ``streaming.replica_media.MediaReplica``) and ``replica_kwargs`` its extra
            arguments.
    """

    def __init__(self, model: str, config: EngineConfig, model_kwargs: dict,
                 threads: int | None, resources: dict[str, float], lock: threading.RLock,
                 replica_cls: type = EngineReplica, replica_kwargs: dict | None = None):
        self.replicas: dict[int, Replica] = {}
        self.frontend_id = uuid.uuid4().hex[:8]  # names this front end's replicas
        self._args = (model, config, model_kwargs, threads)
        self._cls, self._kwargs = replica_cls, replica_kwargs or {}
        self._resources = resources
        self._lock = lock
        self._next_replica = 0
        self._actor_cls: Any = None

    def open(self) -> None:
        """Make the actor class (Ray must be up)."""
        import ray

        # NOTE: commands run in the default concurrency group, one thread: Ray executes one
        # caller's calls in submission order only there (in a threaded group a pause and the
        # resume right after it could swap). The long poll and the metrics get a group of
        # their own, so they never wait behind a command nor block one; so do media offers.
        self._actor_cls = ray.remote(  # type: ignore[call-overload]
            concurrency_groups={"poll": 2, "studio": 1, "media": 2})(self._cls)
        others = [n for n in ray.util.list_named_actors() if n.startswith("ws-replica-")]
        if others:  # NOTE: not killed: another live front end may share this cluster
            log.warning("%d engine replica(s) of another front end are alive in this Ray "
                        "cluster (an earlier front end that just ended, or another one "
                        "serving): left alone; Ray ends a front end's replicas with it, and "
                        "pages of an ended front end get 404 and start a new session",
                        len(others))

    def launch(self) -> Replica:
        """Start one replica's process (not yet serving: see :meth:`await_ready`), named in
        the cluster after this front end. SPREAD: replicas go to different hosts first, so a
        host lost takes the fewest."""
        with self._lock:
            rep_id = self._next_replica
            self._next_replica += 1
        handle = self._actor_cls.options(
            name=f"ws-replica-{self.frontend_id}-{rep_id}", max_restarts=0,
            scheduling_strategy="SPREAD", **self._resources).remote(*self._args, **self._kwargs)
        return Replica(rep_id, handle, {})

    def await_ready(self, rep: Replica, pump: Callable[[Replica], None],
                    timeout_s: float = 600) -> None:
        """Wait until ``rep`` serves, then add it and start its thread ``pump(rep)``. Raises
        RuntimeError (the replica killed) when it does not start within ``timeout_s``."""
        import ray

        try:
            rep.info = ray.get(rep.handle.describe.remote(), timeout=timeout_s)
        except Exception as err:
            ray.kill(rep.handle)
            raise RuntimeError(f"engine replica {rep.id} did not start: {err}") from err
        rep.pump = threading.Thread(target=pump, args=(rep,), name=f"ray-pump-{rep.id}",
                                    daemon=True)
        with self._lock:
            self.replicas[rep.id] = rep
        rep.pump.start()

    def live(self) -> list[Replica]:
        with self._lock:
            return [r for r in self.replicas.values() if r.alive]

    def place(self, exclude: int | None = None, avoid_host: str | None = None
              ) -> Replica | None:
        return place(self.live(), exclude, avoid_host)

    def refresh_metrics(self, timeout_s: float = 1.0) -> set[int]:
        """Fetch every live replica's metrics, all at once, waiting at most ``timeout_s``: a
        replica that does not answer in time keeps its last metrics (a dead one is failed
        over by its pump; a frozen one by the health check, which must not wait on it).
        Returns the ids of the replicas whose metrics are fresh."""
        import ray

        refs = {rep.id: (rep, rep.handle.metrics.options(concurrency_group="poll").remote())
                for rep in self.live()}
        if not refs:
            return set()
        ready, _ = ray.wait([ref for _, ref in refs.values()], num_returns=len(refs),
                            timeout=timeout_s)
        done, fresh = set(ready), set()
        for rep, ref in refs.values():
            if ref in done:
                try:
                    rep.metrics = ray.get(ref)
                    fresh.add(rep.id)
                except Exception:  # died meanwhile: its pump fails it over
                    pass
        return fresh

    def stop(self, rep: Replica) -> None:
        """Take ``rep`` out of the table (its pump then ends quietly) and stop its process."""
        import ray

        with self._lock:
            rep.alive = False
            self.replicas.pop(rep.id, None)
        try:
            ray.get(rep.handle.stop.remote(), timeout=10)
        except Exception:  # already dead, or hangs: killed below either way
            pass
        ray.kill(rep.handle)

    def stop_all(self) -> None:
        """Stop every replica and wait a little for its pump to end."""
        import ray

        with self._lock:
            replicas = list(self.replicas.values())
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
