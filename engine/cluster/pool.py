"""The engine replicas as Ray actors: starting Ray sized for them, launching one and waiting
until it serves, polling their metrics, growing or shrinking their count toward the wanted
one, and stopping them."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

from worldstream.engine.cluster.placement import Replica, idle_replicas, mark_idle, place
from worldstream.engine.cluster.replica import EngineReplica
from worldstream.engine.core.config import EngineConfig


def init_ray(address: str | None, max_replicas: int, resources: dict[str, float]) -> bool:
    """Join ``address`` (None: start a local Ray) unless Ray is up already; True when this
    call started it (the caller then shuts it down)."""
    import ray

    if ray.is_initialized():
        return False
    kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False,
                              "configure_logging": False}
    if address is None:
        # room for every replica the autoscaler may start (and one replacing a dead
        # one) even on a small machine: replicas then share its cores
        need = (max_replicas + 1) * max(resources["num_cpus"], 1)
        kwargs["num_cpus"] = int(max(os.cpu_count() or 1, need))
        # NOTE: Ray starts its workers at nice 15 (``worker_niceness``) to keep its own
        # daemons responsive; a replica is a real-time server and starves at nice 15 beside
        # busy processes. A cluster started elsewhere needs RAY_worker_niceness=0.
        kwargs["_system_config"] = {"worker_niceness": 0}
    ray.init(address=address, **kwargs)
    return True


class ReplicaPool:
    """The replicas of one router, by id (``replicas``, guarded by ``lock``, the router's).

    Args:
        model, config, model_kwargs, threads: what every replica loads and runs.
        resources: Ray resources of one replica (``num_cpus``, ``num_gpus``).
        lock: the router's lock.
    """

    def __init__(self, model: str, config: EngineConfig, model_kwargs: dict,
                 threads: int | None, resources: dict[str, float], lock: threading.RLock):
        self.replicas: dict[int, Replica] = {}
        self._args = (model, config, model_kwargs, threads)
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
        # their own, so they never wait behind a command nor block one.
        self._actor_cls = ray.remote(concurrency_groups={"poll": 2, "studio": 1})(
            EngineReplica).options(max_restarts=0, **self._resources)

    def launch(self) -> Replica:
        """Start one replica's process (not yet serving: see :meth:`await_ready`)."""
        handle = self._actor_cls.remote(*self._args)
        with self._lock:
            rep = Replica(self._next_replica, handle, {})
            self._next_replica += 1
        return rep

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

    def place(self, exclude: int | None = None) -> Replica | None:
        return place(self.live(), exclude)

    def refresh_metrics(self) -> None:
        import ray

        for rep in self.live():
            try:
                rep.metrics = ray.get(
                    rep.handle.metrics.options(concurrency_group="poll").remote(),
                    timeout=10)
            except Exception:  # a dead replica: its pump fails it over
                pass

    def autoscale(self, want: int, pump: Callable[[Replica], None]) -> None:
        """Start one replica when fewer than ``want`` live, or stop one that has been idle
        for a while when more do."""
        import ray

        live = self.live()
        now = time.monotonic()
        mark_idle(live, now)
        if len(live) < want:
            self.await_ready(self.launch(), pump)
            return
        with self._lock:  # an idle replica, idle for a while, with no creation in flight
            idle = idle_replicas(live, now)
            if len(live) <= want or not idle:
                return
            rep = idle[-1]
            rep.alive = False
            del self.replicas[rep.id]
        try:
            ray.get(rep.handle.stop.remote(), timeout=10)
        finally:
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
