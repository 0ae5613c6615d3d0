"""The front end's table entries for replicas and routed sessions, and the rules that read
them: where a new session goes (never to a replica being drained) and how many replicas the
live sessions want. Plain data and arithmetic: no Ray here."""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from typing import Any

from worldstream.engine.cluster.journal import Journal
from worldstream.engine.core.api import EventQueue, FrameSlot, SessionInfo


@dataclass
class Replica:
    id: int
    handle: Any
    info: dict
    alive: bool = True
    sessions: set[str] = field(default_factory=set)  # public session ids placed here
    pending: int = 0  # sessions being created here right now
    failovers: int = 0  # sessions this replica took over from a dead one
    metrics: dict = field(default_factory=dict)
    offset_ns: int | None = None  # local perf_counter_ns minus the replica's
    draining_since: float | None = None  # monotonic s since it takes no new session
    pump: threading.Thread | None = None
    last_reply: float | None = None  # monotonic s of its last answered pull
    batches: int = -1  # its engine's batch count at the last metrics
    stalled_since: float | None = None  # monotonic s since sessions wait and no batch ran

    @property
    def host(self) -> str:
        """The host it runs on (its cluster address; the host name outside a cluster)."""
        return str(self.info.get("address") or self.info.get("node") or "?")


@dataclass
class RoutedSession:
    """A session as the front end sees it: where it lives, who watches, what to restore."""

    info: SessionInfo  # the public id and size
    replica: int
    remote_id: str
    journal: Journal
    slots: list[FrameSlot] = field(default_factory=list)
    events: EventQueue = field(default_factory=EventQueue)
    index_offset: int = 0  # public frame index = the replica's + this (continues on failover)
    next_index: int = 0
    forwarding: bool = True  # its replica sends its frames here (media from the replica: on ask)


def place(live: list[Replica], exclude: int | None = None,
          avoid_host: str | None = None) -> Replica | None:
    """The live replica with room and the fewest sessions, then on the host with the fewest
    (a host lost takes the fewest), then with the fastest chunks; never one being drained;
    one on ``avoid_host`` (the host of a replica that just died: its others may be dying
    too) only when no other host has room."""
    candidates = [r for r in live if r.id != exclude and r.draining_since is None
                  and len(r.sessions) + r.pending < r.info["capacity"]]
    elsewhere = [r for r in candidates if r.host != avoid_host]
    candidates = elsewhere or candidates
    if not candidates:
        return None
    per_host: dict[str, int] = {}
    for r in live:
        per_host[r.host] = per_host.get(r.host, 0) + len(r.sessions) + r.pending
    return min(candidates, key=lambda r: (len(r.sessions) + r.pending, per_host[r.host],
                                          r.metrics.get("chunk_ms_p50") or 0.0, r.id))


def wanted_replicas(live: list[Replica], num_sessions: int, min_replicas: int,
                    max_replicas: int) -> int:
    """One replica per ``capacity`` live sessions plus room for the next user, within
    ``[min_replicas, max_replicas]``."""
    per = live[0].info["capacity"] if live else 1
    want = math.ceil((num_sessions + 1) / max(per, 1))
    return min(max(want, min_replicas), max_replicas)
