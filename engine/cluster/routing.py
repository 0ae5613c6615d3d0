"""What the router's helpers (``delivery``, ``failover``, ``media_calls``, ``scaling``) use of
the router (``router.RayEngine``), as a ``Protocol``: they annotate with it and never import
the router that imports them, so imports go one way (router -> helpers)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, Protocol

from worldstream.engine.cluster.placement import Replica, RoutedSession
from worldstream.engine.cluster.pool import ReplicaPool


class Router(Protocol):
    """The router's state its helpers share, all under ``_lock``: ``_replicas`` by id,
    ``_sessions`` by front-end session id, ``_by_remote`` (replica id, replica's session id)
    -> front-end session id; ``_pull_s``: how long a pull waits for frames (s);
    ``_stopping``: set when the router stops; ``note_handler``: the front end's callback for
    notes a session's page is sent (None: none)."""

    max_replicas: int
    media_on_replicas: bool
    note_handler: Callable[[str, dict], None] | None
    _lock: AbstractContextManager[Any]
    _pool: ReplicaPool
    _pull_s: float
    _replicas: dict[int, Replica]
    _sessions: dict[str, RoutedSession]
    _by_remote: dict[tuple[int, str], str]
    _stopping: threading.Event

    def close_session(self, session_id: str) -> None: ...

    def desired_replicas(self) -> int: ...

    def _routed(self, session_id: str) -> RoutedSession: ...

    def _pump(self, rep: Replica) -> None: ...

    def _notify(self, session_id: str, note: dict) -> None: ...

    def _sync_forwarding(self, session_id: str) -> None: ...
