"""Request bodies bounded before they are read: each route's byte limit checked as the body
streams in (a declared Content-Length at once, a chunked body as its bytes arrive), and the
uploads (save points, pictures, stories) bounded per session and in all, so that the server's
memory stays within ``Limits.upload_budget_bytes`` over idle whatever clients send.

Errors are the API's own (``app.errors.ApiError``): 413 past a route's limit, 400 for a
malformed Content-Length, 429 when a session already has its uploads in flight, 503 (with
Retry-After) while the server's upload budget is taken by others.
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

from worldstream.app.errors import ApiError


class BodyTooLarge(ApiError):
    """A body past its route's limit, found while it streams in (a 413)."""

    def __init__(self, limit: int):
        super().__init__(413, f"the body exceeds the limit of {limit} bytes", "body")


#: a save point, picture or story route: ``POST /api/sessions/{id}/<upload>``
_UPLOAD_ROUTE = re.compile(r"^/api/sessions/[^/]+/(state|picture|story)$")


def route_limits(default: int, uploads: dict[str, int]) -> Callable[[str, str], int]:
    """``limit_of(method, path)``: the byte limit of a request's body, ``uploads[name]`` for
    ``POST /api/sessions/{id}/<name>`` and ``default`` for every other request."""

    def limit_of(method: str, path: str) -> int:
        found = _UPLOAD_ROUTE.match(path)
        if method == "POST" and found and found.group(1) in uploads:
            return uploads[found.group(1)]
        return default

    return limit_of


class BodyLimit:
    """ASGI middleware: every HTTP request's body against ``limit_of(method, path)`` before
    and while it is read. A declared Content-Length over the limit (or not a number) is
    answered at once without reading a byte; a body that grows past it as it streams
    (chunked, or longer than declared) raises :class:`BodyTooLarge` from ``receive``, which
    the app's exception handler turns into the 413 (the rest is never read)."""

    def __init__(self, app: Any, limit_of: Callable[[str, str], int]):
        self.app, self.limit_of = app, limit_of

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit_of(scope["method"], scope["path"])
        declared = [v for k, v in scope.get("headers", ()) if k.lower() == b"content-length"]
        if declared:
            text = declared[0].decode("latin-1").strip()
            if not text.isdigit() or len(declared) > 1:
                await _reply(ApiError(400, "malformed Content-Length", "content-length"),
                             scope, receive, send)
                return
            if int(text) > limit:
                await _reply(ApiError(413, f"{text} bytes exceeds the limit of {limit} bytes",
                                      "body"), scope, receive, send)
                return
        seen = 0

        async def counted() -> dict:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise BodyTooLarge(limit)
            return message

        await self.app(scope, counted, send)


async def _reply(error: ApiError, scope: dict, receive: Callable, send: Callable) -> None:
    # NOTE: Connection: close: the unread body must not be taken for the next request
    response = error.response()
    response.headers["connection"] = "close"
    await response(scope, receive, send)


class UploadBudget:
    """Uploads in flight: at most ``per_session`` per session, and their bytes (counted as
    they arrive, held until the route is done with them) at most ``budget_bytes`` in all.

    Thread-safe (the counters are touched from the event loop only, but cheap to guard)."""

    def __init__(self, per_session: int, budget_bytes: int, retry_after_s: float = 2.0):
        self.per_session, self.budget_bytes = per_session, budget_bytes
        self.retry_after_s = retry_after_s
        self._lock = threading.Lock()
        self._sessions: dict[str, int] = {}
        self._bytes = 0

    @property
    def bytes_in_flight(self) -> int:
        return self._bytes

    @contextlib.asynccontextmanager
    async def slot(self, session_id: str) -> AsyncIterator[_Upload]:
        """One upload of ``session_id`` for the body of the ``async with``: 429 when the
        session already has ``per_session`` in flight; the bytes its ``take`` counted are
        given back at the end."""
        with self._lock:
            held = self._sessions.get(session_id, 0)
            if held >= self.per_session:
                raise ApiError(429, f"this session already has {held} upload(s) in flight; "
                                    "wait for it to finish", "body",
                               headers={"Retry-After": "1"})
            self._sessions[session_id] = held + 1
        upload = _Upload(self)
        try:
            yield upload
        finally:
            with self._lock:
                self._bytes -= upload.taken
                left = self._sessions[session_id] - 1
                if left:
                    self._sessions[session_id] = left
                else:
                    del self._sessions[session_id]

    def _take(self, upload: _Upload, count: int) -> None:
        with self._lock:
            if upload.taken + count > self.budget_bytes:
                raise ApiError(413, f"the upload exceeds this server's upload budget of "
                                    f"{self.budget_bytes} bytes", "body")
            if self._bytes + count > self.budget_bytes:
                raise ApiError(503, "other uploads fill this server's upload budget; retry "
                                    "shortly", "body", retry_after_s=self.retry_after_s,
                               headers={"Retry-After": str(max(1, round(self.retry_after_s)))})
            self._bytes += count
            upload.taken += count


class _Upload:
    """One upload's share of an :class:`UploadBudget`: ``take(n)`` before holding ``n`` more
    bytes of it."""

    def __init__(self, budget: UploadBudget):
        self.budget, self.taken = budget, 0

    def take(self, count: int) -> None:
        self.budget._take(self, count)
