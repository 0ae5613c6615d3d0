"""Prompt preparation off the engine thread: a worker thread runs the backend's text encoder
before a prompt command reaches the engine, so that one session's prompts never stall every
session's generation.

Why: encoding a prompt costs a large part of a chunk's time on a CPU, so on the engine thread
one session's prompt flood would freeze every other session's video. Here each session gets at
most ``per_s`` encodings per second; prompts that
arrive faster are coalesced (the latest waiting prompt wins: intermediate texts would be shown
for a fraction of a frame at best), and the work runs beside the engine thread, not on it.

Order: a session's ``fork``, ``adopt`` and ``rewind`` depend on its prompt (a fork copies it, a
rewind recaches under it), so they wait behind a pending prompt of their session. Actions and
settings do not depend on it and never wait: a key press is never delayed by a prompt.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from worldstream.engine.core.api import ActionCommand, PromptCommand, SettingsCommand
from worldstream.engine.core.inbox import Apply

log = logging.getLogger(__name__)

#: commands that do not depend on the session's prompt (never held behind one)
_INDEPENDENT = (ActionCommand, SettingsCommand)


@dataclass
class _Backlog:
    """One session's commands waiting behind its oldest pending prompt (the head)."""

    items: deque[Apply] = field(default_factory=deque)  # the engine inbox's commands
    preparing: bool = False  # the head prompt is being encoded now
    ready_at: float = 0.0  # monotonic s: when this session's next encoding may start


class PromptPrefetcher:
    """Runs ``prepare(command)`` for prompt commands on a worker thread, then hands them (and
    the commands held behind them) to ``forward`` in the order they were submitted.

    ``prepare`` must be thread-safe and side-effect free apart from caches (the backend's
    ``prepare_prompt``: it warms the text-embedding cache so that ``set_prompt`` on the engine
    thread is a lookup). Its exceptions are logged and ignored: the engine reports a bad prompt
    when it applies it. ``per_s``: encodings per second per session. ``superseded`` counts
    prompts replaced by a newer one before they were encoded."""

    def __init__(self, prepare: Callable[[PromptCommand], None],
                 forward: Callable[[Apply], None], per_s: float = 4.0,
                 clock: Callable[[], float] = time.monotonic):
        if per_s <= 0:
            raise ValueError(f"per_s must be > 0, got {per_s}")
        self._prepare, self._forward, self._interval = prepare, forward, 1.0 / per_s
        self._clock = clock
        self._backlogs: dict[str, _Backlog] = {}
        self._cond = threading.Condition()
        self._stopped = False
        self.superseded = 0
        self._thread = threading.Thread(target=self._run, name="prompt-prefetch", daemon=True)

    def start(self) -> PromptPrefetcher:
        self._thread.start()
        return self

    def submit(self, session_id: str, item: Apply) -> None:
        """Queue the engine inbox's command ``item``: prompts go to the
        worker, commands that depend on a pending prompt wait behind it, the rest are
        forwarded at once."""
        command = item.command
        with self._cond:
            backlog = self._backlogs.get(session_id)
            if not isinstance(command, PromptCommand):
                if backlog is None or not backlog.items or isinstance(command, _INDEPENDENT):
                    self._forward(item)
                else:
                    backlog.items.append(item)
                return
            if backlog is None:  # kept until forget(): it remembers the rate
                backlog = self._backlogs[session_id] = _Backlog()
            last = backlog.items[-1] if backlog.items else None
            if (last is not None and isinstance(last.command, PromptCommand)
                    and not (backlog.preparing and len(backlog.items) == 1)):
                backlog.items[-1] = item  # latest wins: the waiting prompt was never shown
                self.superseded += 1
            else:
                backlog.items.append(item)
            self._cond.notify()

    def forget(self, session_id: str) -> None:
        """Drop a closed session's waiting commands."""
        with self._cond:
            self._backlogs.pop(session_id, None)

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _next(self) -> tuple[str, Apply] | None:
        """The session whose head prompt is due soonest, and its head; waits (under the lock)
        until one is due. None when stopped."""
        while not self._stopped:
            now = self._clock()
            waiting = [(b.ready_at, sid) for sid, b in self._backlogs.items()
                       if b.items and not b.preparing]
            due = [w for w in waiting if w[0] <= now]
            if due:
                _, sid = min(due)
                backlog = self._backlogs[sid]
                backlog.preparing = True
                return sid, backlog.items[0]
            timeout = min(w[0] for w in waiting) - now if waiting else None
            self._cond.wait(timeout)
        return None

    def _run(self) -> None:
        while True:
            with self._cond:
                picked = self._next()
            if picked is None:
                return
            session_id, head = picked
            try:
                self._prepare(head.command)
            except Exception:  # the engine answers the client when it applies the prompt
                log.debug("prompt preparation failed", exc_info=True)
            with self._cond:
                backlog = self._backlogs.get(session_id)
                if backlog is None:  # forgotten meanwhile: the session closed
                    continue
                backlog.preparing = False
                backlog.ready_at = self._clock() + self._interval
                self._forward(backlog.items.popleft())
                while backlog.items and not isinstance(backlog.items[0].command, PromptCommand):
                    self._forward(backlog.items.popleft())
