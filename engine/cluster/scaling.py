"""Autoscaling: the replica count follows the live sessions (``placement.wanted_replicas``)
between ``min_replicas`` and ``max_replicas``, looked at by the router's monitor.

- **Up**: a drained replica not yet stopped is taken back first (it is warm), else one new
  replica is started per look (each loads its model: seconds to minutes).
- **Down, by draining**: once there have been more replicas than wanted for
  ``scale_down_after_s`` (a dip must not stop a warm replica only to start one again), the
  surplus, emptiest first, is drained: placement gives it no new session; its sessions may
  end by themselves for ``drain_s``; those still there are then moved to the others from
  their journals (``failover.recreate``: the new copy runs before the old one is closed, so a
  moved session sees one failover's gap, never an end); a drained replica holding no session
  is stopped. A scale-down never ends a session.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from worldstream.engine.cluster.failover import recreate
from worldstream.engine.cluster.placement import Replica

if TYPE_CHECKING:
    from worldstream.engine.cluster.routing import Router

log = logging.getLogger("worldstream.engine.cluster")

#: more replicas than wanted for this long before one is drained (no flapping), s
SCALE_DOWN_AFTER_S = 30.0
#: how long a drained replica's sessions may end by themselves before they are moved, s
DRAIN_S = 60.0


@dataclass
class Plan:
    """What one look does: ``launch`` one replica, take ``undrain`` back, start draining
    ``drain``, move the sessions off ``move``, stop ``stop`` (drained and empty)."""

    surplus_since: float | None
    launch: bool = False
    undrain: list[Replica] = field(default_factory=list)
    drain: list[Replica] = field(default_factory=list)
    move: list[Replica] = field(default_factory=list)
    stop: list[Replica] = field(default_factory=list)


def _busy(rep: Replica) -> int:
    return len(rep.sessions) + rep.pending


def plan(live: list[Replica], want: int, now: float, surplus_since: float | None, *,
         scale_down_after_s: float = SCALE_DOWN_AFTER_S, drain_s: float = DRAIN_S) -> Plan:
    """One look's plan for ``live`` replicas toward ``want`` at ``now`` (monotonic s);
    ``surplus_since``: since when there have been too many (the returned plan's is the next
    look's). Pure: changes nothing."""
    draining = [r for r in live if r.draining_since is not None]
    active = [r for r in live if r.draining_since is None]
    out = Plan(surplus_since=surplus_since)
    if len(active) < want:
        out.surplus_since = None
        out.undrain = sorted(draining, key=lambda r: (-_busy(r), r.id))[:want - len(active)]
        out.launch = len(active) + len(out.undrain) < want
        draining = [r for r in draining if r not in out.undrain]
    elif len(active) > want:
        out.surplus_since = now if surplus_since is None else surplus_since
        if now - out.surplus_since >= scale_down_after_s:
            # the emptiest (then the newest) go: the fewest sessions to wait for or move
            out.drain = sorted(active, key=lambda r: (_busy(r), -r.id))[:len(active) - want]
    else:
        out.surplus_since = None
    out.stop = [r for r in draining if not _busy(r)]
    out.move = [r for r in draining if r.sessions and now - r.draining_since >= drain_s]
    return out


class Scaler:
    """Applies :func:`plan` to a router's replicas, one look per :meth:`step`."""

    def __init__(self, scale_down_after_s: float = SCALE_DOWN_AFTER_S,
                 drain_s: float = DRAIN_S):
        if scale_down_after_s < 0 or drain_s < 0:
            raise ValueError("scale_down_after_s and drain_s must be >= 0")
        self.scale_down_after_s, self.drain_s = scale_down_after_s, drain_s
        self.surplus_since: float | None = None

    def step(self, engine: Router, now: float) -> None:
        """One look at ``engine``'s replicas at ``now`` (monotonic s)."""
        pool = engine._pool
        with engine._lock:  # decided and marked at once: no placement sees a half state
            p = plan(pool.live(), engine.desired_replicas(), now, self.surplus_since,
                     scale_down_after_s=self.scale_down_after_s, drain_s=self.drain_s)
            self.surplus_since = p.surplus_since
            for rep in p.drain:
                rep.draining_since = now
            for rep in p.undrain:
                rep.draining_since = None
            for rep in p.stop:  # out of the table before anything can be placed on it
                rep.alive = False
                pool.replicas.pop(rep.id, None)
        for rep in p.drain:
            log.info("draining engine replica %d (%s, %d session(s)): more replicas than "
                     "sessions want", rep.id, rep.host, _busy(rep))
        for rep in p.undrain:
            log.info("engine replica %d serves again: the sessions came back", rep.id)
        for rep in p.stop:
            log.info("engine replica %d drained: stopped", rep.id)
            pool.stop(rep)
        for rep in p.move:
            move_out(engine, rep)
        if p.launch:
            pool.await_ready(pool.launch(), engine._pump)


def move_out(engine: Router, rep: Replica) -> int:
    """Move the sessions of drained ``rep`` to replicas with room; a session with nowhere to
    go, or whose move fails, stays served where it is (tried again next look). Returns how
    many moved."""
    with engine._lock:
        moving = [(sid, engine._sessions[sid]) for sid in sorted(rep.sessions)
                  if sid in engine._sessions]
    moved = 0
    for sid, routed in moving:
        with engine._lock:
            target = engine._pool.place(exclude=rep.id)
            if target is None:
                log.info("draining replica %d: no room elsewhere for session %s yet",
                         rep.id, sid)
                return moved
            target.pending += 1  # its place held while the copy is made
        old = routed.remote_id
        try:
            payload = recreate(engine, sid, routed, rep, target)
        except Exception as err:
            log.warning("moving session %s off draining replica %d failed (%r): it stays",
                        sid, rep.id, err)
            continue
        finally:
            with engine._lock:
                target.pending -= 1
        if payload is None:  # closed meanwhile
            continue
        if engine.media_on_replicas:  # its viewers come back with offers to the new replica
            engine._notify(sid, {"kind": "transports", "n": 0, "moved": True})
        rep.handle.close_session.remote(old)
        moved += 1
        log.info("session %s moved off draining replica %d to %d (%s)", sid, rep.id,
                 target.id, target.host)
    return moved
