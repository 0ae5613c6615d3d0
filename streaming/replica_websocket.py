"""The WebSocket fallback from the host that generates the session (issue 55): a small
Starlette app on uvicorn inside a media replica (``streaming.replica_media``), on the replica
host's cluster address and a free port, serving ``/api/sessions/{id}/ws`` exactly as the front
end's route does (``streaming.websocket.serve_websocket``: same frames, messages, flow control
and per-session connection limit). The frames are JPEG-encoded here, where they are made, so
a WebSocket viewer costs the front end nothing per frame, as a WebRTC one does.

NOTE: how the front end's checks carry over.
- Token: the front end hands the session's token to this replica when the page asks it where
  to connect (``GET /api/sessions/{id}/ws-url``, after the page authenticated there); an
  upgrade here must present it (``?token=``). The front end and its replicas trust each other
  already (the replica holds the session's whole stream); the client never trusts the replica
  with more than the token it already sends there. An unknown session answers 401 like a wrong
  token: this replica cannot know whether the front end hides existence (``--auth``), so it
  takes the stricter rule. Failed attempts are throttled per client address, as there.
- Origin: the front end accepts a browser's upgrade only from its own origin (the ``Host`` it
  was reached by) or one allowed with ``--allowed-origin``. Here the ``Host`` is the replica's
  address, never the page's, so "same origin" would refuse the very page the front end served.
  The front end therefore names the origins it accepted for the page's request (its own under
  the ``Host`` the page used, both schemes, plus the allowed ones), and this replica accepts a
  browser upgrade from those alone: a page on another site is refused here as it is there. No
  ``Origin`` (a non-browser client) is accepted, as there: the token guards it.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from concurrent.futures import Future

from starlette.applications import Starlette
from starlette.routing import WebSocketRoute
from starlette.websockets import WebSocket

from worldstream.streaming.limits import ClientBuckets, Limits
from worldstream.streaming.sessions import BadTokenError, SessionManager, UnknownSessionError
from worldstream.streaming.websocket import refusal, serve_websocket

#: the longest the server may take to start listening, s
START_TIMEOUT_S = 10.0


class ReplicaWebSocketServer:
    """Serves the WebSocket fallback of ``manager``'s sessions (the replica's
    ``ReplicaSessions``) on ``loop`` (a running loop of another thread), bound to ``address``
    (None: loopback, outside a Ray cluster) on a free port. Raises OSError when it cannot bind.
    """

    def __init__(self, manager: SessionManager, limits: Limits, address: str | None,
                 loop: asyncio.AbstractEventLoop):
        import uvicorn

        self.manager, self._loop = manager, loop
        host = address or "127.0.0.1"
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._sock = socket.socket(family, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, 0))
        self.port = self._sock.getsockname()[1]
        self._base = f"ws://{f'[{host}]' if family == socket.AF_INET6 else host}:{self.port}"
        self._origins: dict[str, frozenset[str]] = {}
        self._throttle = ClientBuckets(limits.auth_failures_per_s, limits.auth_failure_burst)
        app = Starlette(routes=[WebSocketRoute("/api/sessions/{session_id}/ws", self._route)])
        self._server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
        self._serving: Future = asyncio.run_coroutine_threadsafe(
            self._server.serve(sockets=[self._sock]), loop)
        asyncio.run_coroutine_threadsafe(self._started(), loop).result(START_TIMEOUT_S)

    async def _started(self) -> None:
        while not self._server.started:
            if self._serving.done():  # failed to start: its error
                self._serving.result()
            await asyncio.sleep(0.01)

    def admit(self, session_id: str, token: str, origins: tuple[str, ...]) -> str:
        """Accept upgrades for ``session_id`` (already adopted by the manager) with ``token``
        from browser pages of ``origins`` (``scheme://host[:port]``); returns its URL (the
        client adds ``?token=``). ValueError for an empty token (nothing would match it)."""
        if not token:
            raise ValueError("a WebSocket needs the session's token")
        session = next((s for s in self.manager.sessions() if s.session_id == session_id),
                       None)
        if session is None:
            raise UnknownSessionError(session_id)
        session.token = token
        self._origins[session_id] = frozenset(o.rstrip("/") for o in origins)
        return f"{self._base}/api/sessions/{session_id}/ws"

    def forget(self, session_id: str) -> None:
        self._origins.pop(session_id, None)

    async def _route(self, ws: WebSocket) -> None:
        session_id = ws.path_params["session_id"]
        origin = ws.headers.get("origin")
        client = ws.client.host if ws.client is not None else "unknown"
        if origin is not None and origin.rstrip("/") not in self._origins.get(session_id, ()):
            await ws.send_denial_response(refusal(403, "cross-origin WebSocket refused",
                                                  "origin"))
            return
        try:
            session = self.manager.authenticate(session_id, ws.query_params.get("token"))
        except (UnknownSessionError, BadTokenError):
            # as on the front end: only failures count, and only they are refused for it
            throttled = self._throttle.empty(client)
            self._throttle.take(client)
            await ws.send_denial_response(
                refusal(429, "too many failed authentications", "authorization") if throttled
                else refusal(401, "missing or wrong bearer token", "authorization"))
            return
        if not session.rate.allow():
            limit = self.manager.limits.messages_per_s
            await ws.send_denial_response(refusal(429, f"more than {limit:g} requests/s",
                                                  "session_id"))
            return
        await serve_websocket(self.manager, session, ws)

    def stop(self) -> None:
        """Stop listening (open connections close with their sessions)."""
        self._server.should_exit = True
        with contextlib.suppress(Exception):
            self._serving.result(5)
        self._sock.close()
