"""Is a replica alive and working, and which hosts are in the cluster: the front end's rules
for a replica that hangs (not dead, just silent past its deadline) and for hosts that join or
leave. Plain data and arithmetic, no Ray calls (``pool`` and ``router`` feed them)."""

from __future__ import annotations

import logging

from worldstream.engine.cluster.placement import Replica

log = logging.getLogger("worldstream.engine.cluster")

#: a replica silent this long past its chunk deadline is failed over, s. NOTE: a replica
#: answers a pull every 0.05-0.5 s and runs a chunk every 1/fps..chunk_frames/fps s; under a
#: loaded 2-core machine a pause of a second happens, three seconds does not.
HANG_AFTER_S = 3.0


def note_reply(rep: Replica, now: float) -> None:
    """A pull of ``rep`` was answered at ``now`` (monotonic s)."""
    rep.last_reply = now


def note_metrics(rep: Replica, metrics: dict, now: float) -> None:
    """Start (or clear) ``rep``'s stall clock from its metrics: sessions wait (``unpaused``)
    and its engine ran no batch (``batches``) since the last metrics."""
    batches, waiting = metrics.get("batches", -1), metrics.get("unpaused", 0)
    if batches != rep.batches or not waiting:
        rep.stalled_since = None
    elif rep.stalled_since is None:
        rep.stalled_since = now
    rep.batches = batches


#: a replica's deadline is at least this many of its slowest recent chunks (a model whose
#: chunk takes 0.75 s may be silent for 7.5 s before it counts as hung)
DEADLINE_CHUNKS = 10


def deadline_s(rep: Replica, hang_after_s: float = HANG_AFTER_S) -> float:
    """How long ``rep`` may be silent: ``hang_after_s`` or ``DEADLINE_CHUNKS`` of its chunk
    time p95 (its metrics), whichever is longer, s."""
    chunk_ms = rep.metrics.get("chunk_ms_p95") or 0.0
    return max(hang_after_s, DEADLINE_CHUNKS * chunk_ms / 1e3)


def silent(rep: Replica, now: float, hang_after_s: float = HANG_AFTER_S) -> str | None:
    """Why ``rep`` counts as hung at ``now``, or None: no pull answered past its deadline
    (:func:`deadline_s`: the process is frozen or its host unreachable), or sessions waiting
    and no chunk run past it (its engine thread is stuck)."""
    limit = deadline_s(rep, hang_after_s)
    if rep.last_reply is not None and now - rep.last_reply > limit:
        return f"no answer for {now - rep.last_reply:.1f} s"
    if rep.stalled_since is not None and now - rep.stalled_since > limit:
        return f"no chunk for {now - rep.stalled_since:.1f} s with sessions waiting"
    return None


class HostWatch:
    """The cluster's hosts as last seen: logs one line when a host joins (or joins late:
    replicas started from then on may be placed there) and when one leaves."""

    def __init__(self) -> None:
        self.hosts: set[str] | None = None

    def update(self, alive: set[str]) -> tuple[set[str], set[str]]:
        """``alive``: the addresses of the live nodes now. Returns (joined, left) since the
        last update (nothing on the first)."""
        if self.hosts is None:
            self.hosts = set(alive)
            log.info("Ray cluster: %d host(s): %s", len(alive), ", ".join(sorted(alive)))
            return set(), set()
        joined, left = alive - self.hosts, self.hosts - alive
        for host in sorted(joined):
            log.warning("host %s joined the Ray cluster; new replicas may be placed there",
                        host)
        for host in sorted(left):
            log.warning("host %s left the Ray cluster; its replicas fail over", host)
        self.hosts = set(alive)
        return joined, left
