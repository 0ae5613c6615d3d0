"""Helpers supervised: the child processes and worker pools that do slow work away from the
engine thread and the event loop (a game's episode starts made ahead, a save point's replay,
the studio routes' loads). Every wait on a child has a timeout; a helper that dies or hangs
is replaced, and only the job it held fails, with :class:`HelperError` (the cause it saw,
never blamed on the job's input); jobs in flight are bounded (a full helper says so at once).
No torch here.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any


class HelperError(RuntimeError):
    """A helper failed the job (its process died, it overran its timeout, it was full): not
    the job's input; the job may be retried. The message is one line naming the cause."""


def _lower_priority(nice: int) -> None:
    try:
        os.setpriority(os.PRIO_PROCESS, 0, nice)
    except OSError:
        pass


class HelperPool:
    """A supervised pool of ``workers`` spawned processes at niceness ``nice``.

    ``submit`` returns the job's Future, or None when ``max_pending`` jobs are in flight (the
    caller does the work its own way or refuses). A pool whose process died (the Futures it
    held fail with BrokenProcessPool) is replaced at the next ``submit``; a job running past
    ``timeout_s`` has the pool's processes killed (its Future fails with BrokenProcessPool)
    and the pool replaced.
    Thread-safe."""

    def __init__(self, workers: int = 1, *, nice: int = 10, timeout_s: float = 60.0,
                 max_pending: int = 16, clock: Callable[[], float] = time.monotonic):
        self.workers, self.nice, self.timeout_s = workers, nice, timeout_s
        self.max_pending, self._clock = max_pending, clock
        # re-entrant: a Future's done callback (``_done``) may run in the thread holding it
        self._lock = threading.RLock()
        self._pool: ProcessPoolExecutor | None = None
        self._pending: dict[Future, float] = {}  # job -> when it was submitted
        #: pools replaced so far (a dead or hung one)
        self.replaced = 0

    def submit(self, function: Callable[..., Any], *args: Any) -> Future | None:
        """``function(*args)`` in a worker (both picklable); None when full."""
        with self._lock:
            self._supervise()
            if len(self._pending) >= self.max_pending:
                return None
            for _ in range(2):  # a pool found broken here is replaced once
                pool = self._live_pool()
                try:
                    future = pool.submit(function, *args)
                except (BrokenProcessPool, RuntimeError):
                    self._replace()
                    continue
                self._pending[future] = self._clock()
                future.add_done_callback(self._done)
                return future
        raise HelperError("the helper process cannot be started")

    def _done(self, future: Future) -> None:
        with self._lock:
            self._pending.pop(future, None)

    def _live_pool(self) -> ProcessPoolExecutor:
        if self._pool is not None and getattr(self._pool, "_broken", False):
            self._replace()
        if self._pool is None:
            self._pool = ProcessPoolExecutor(
                self.workers, mp_context=multiprocessing.get_context("spawn"),
                initializer=_lower_priority, initargs=(self.nice,))
        return self._pool

    def _supervise(self) -> None:
        """Replace the pool when a job has run past the timeout (a hung helper)."""
        now = self._clock()
        if any(now - t > self.timeout_s for f, t in self._pending.items() if not f.done()):
            self._replace()

    def _replace(self) -> None:
        pool, self._pool = self._pool, None
        if pool is None:
            return
        self.replaced += 1
        # NOTE: ProcessPoolExecutor cannot cancel a running job; its processes are killed
        # (the private map is the only handle on them), which fails every job it held
        for process in list(getattr(pool, "_processes", {}).values()):
            try:
                process.kill()
            except (OSError, AttributeError):
                pass
        # (the pool's own thread fails their Futures with BrokenProcessPool)
        pool.shutdown(wait=False, cancel_futures=True)
        self._pending.clear()

    def processes(self) -> list[int]:
        """The process ids of the pool's workers now (tests kill one)."""
        with self._lock:
            pool = self._pool
            return list(getattr(pool, "_processes", {}) or {}) if pool else []

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)


def run_in_child(function: Callable[..., Any], *args: Any, timeout_s: float,
                 nice: int = 10, what: str = "the helper process") -> Any:
    """``function(*args)`` in a new interpreter (multiprocessing's spawn) at niceness
    ``nice``; its exception is raised here. HelperError when the child dies before it
    answers or does not answer within ``timeout_s`` (it is killed then)."""
    context = multiprocessing.get_context("spawn")
    here, there = context.Pipe()
    process = context.Process(target=_serve_one, args=(there,), daemon=True)
    process.start()
    there.close()
    try:
        # NOTE: reniced at once, the work sent after: passed to start() (frames, actions),
        # it filled the pipe, and start() waited for the child's interpreter to read it
        # while that started at full priority beside the sessions playing
        try:
            if process.pid is not None:  # (0 would renice this process)
                os.setpriority(os.PRIO_PROCESS, process.pid, nice)
        except OSError:  # it has ended already
            pass
        try:
            here.send((function, args))
            if not here.poll(timeout_s):
                raise HelperError(f"{what} did not finish within {timeout_s:g} s")
            ok, result = here.recv()
        except (EOFError, OSError):  # BrokenPipeError, ConnectionResetError: it died
            process.join(5.0)
            raise HelperError(f"{what} died before it answered (exit "
                              f"{process.exitcode})") from None
    finally:
        here.close()
        process.join(1.0)
        if process.is_alive():
            process.kill()
            process.join(5.0)
    if not ok:
        raise result
    return result


def _serve_one(connection: Any) -> None:
    function, args = connection.recv()
    try:
        reply = (True, function(*args))
    except Exception as err:  # noqa: BLE001  (sent to the caller, raised there)
        reply = (False, err)
    connection.send(reply)
    connection.close()
