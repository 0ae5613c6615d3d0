"""The engine thread's inbox: one small frozen dataclass per kind of item, matched by type on
the engine thread (``Engine._handle``). Other threads put them; only the engine thread acts."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from worldstream.engine.core.api import Command
    from worldstream.engine.core.session import Session


@dataclass(frozen=True)
class Wake:
    """Nothing to do: the loop looks again (``stop``)."""


@dataclass(frozen=True)
class Create:
    """Make the session's first state; ``history``: recent frames and held keys to observe
    (a failover's recache), None for a fresh start."""

    session: Session
    history: tuple[Any, Any] | None
    #: the state made ahead off the engine thread (``PreparesStates``): called for it
    make: Callable[[], Any] | None = None


@dataclass(frozen=True)
class Apply:
    """A client's command, received at ``receipt_ns`` (``time.perf_counter_ns``: its
    action-to-frame measurement starts there)."""

    session: Session
    command: Command
    receipt_ns: int


@dataclass(frozen=True)
class Pause:
    session: Session
    paused: bool


@dataclass(frozen=True)
class Close:
    """Free the session's states (its budget came back when it closed)."""

    session: Session


@dataclass(frozen=True)
class Call:
    """``fn(session)`` on the engine thread between two batches; its result or exception
    completes ``future`` (``Engine.call``)."""

    session: Session
    fn: Callable[[Session], Any]
    future: Future


Item = Wake | Create | Apply | Pause | Close | Call
