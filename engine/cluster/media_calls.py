"""Calls from the front end to the media side of a session's replica
(``streaming.replica_media.MediaReplica``) that must find the session wherever it lives now:
a session being moved (failover, drain) waits for its new replica."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from worldstream.engine.cluster.routing import Router


def call(engine: Router, session_id: str, method: str, args: tuple[Any, ...],
         timeout_s: float) -> dict:
    """``method(remote_id, session_id, *args, index_offset=...)`` on the session's live replica
    (its ``media`` concurrency group; ``index_offset``: where its frame indices start, so the
    replica's own transports number on after a failover as the front end does), waiting up
    to ``timeout_s`` for one; its reply (a dict: refusals travel as data). Raises
    SessionClosedError (the session is gone), TimeoutError (no live replica in time, or it
    died during the call: ask again)."""
    import ray

    deadline = time.monotonic() + timeout_s
    while True:
        routed = engine._routed(session_id)  # SessionClosedError
        with engine._lock:  # the replica, its copy and offset: set together by a move
            rep = engine._replicas.get(routed.replica)
            remote_id, offset = routed.remote_id, routed.index_offset
        if rep is not None and rep.alive:
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"session {session_id} has no live replica")
        time.sleep(0.05)
    remote = getattr(rep.handle, method).options(concurrency_group="media")
    try:
        return ray.get(remote.remote(remote_id, session_id, *args, index_offset=offset),
                       timeout=max(1.0, deadline - time.monotonic()))
    except ray.exceptions.GetTimeoutError:
        raise TimeoutError(f"replica {rep.id} did not answer {method}") from None
    except ray.exceptions.RayError:  # died meanwhile: its successor answers the next ask
        raise TimeoutError(f"replica {rep.id} failed during {method}; ask again") from None
