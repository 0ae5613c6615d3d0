"""Who may use the server: the server key (``worldstream play --auth``), the Host and Origin
checks against DNS rebinding and cross-site requests, and the throttle on failed
authentications.

A web page on another site can make a browser send a ``POST`` with ``Content-Type:
text/plain`` and no preflight; with DNS rebinding it can even reach a server bound to loopback
under a foreign ``Host``. So: a request must name one of the server's hosts (Starlette's
``TrustedHostMiddleware``), a browser request from another origin is refused, JSON bodies must
say so (``application/json`` forces a CORS preflight that this server never grants), and when
the server is exposed it can demand a key for creating sessions and reading metrics. Of the
mounted UI framework only what the page loads is served (:func:`page_only`).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from urllib.parse import urlsplit

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from worldstream.streaming.sessions import token_matches

#: the names a loopback-bound server answers to (anything else is DNS rebinding)
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")


@dataclass(frozen=True)
class AccessPolicy:
    """``auth_key``: when set, ``POST /api/sessions`` needs ``Authorization: Bearer
    <auth_key>`` (the page passes it from its ``?key=`` parameter), ``GET /api/metrics`` the key
    or a session's token, and an unknown session id answers 401 like a wrong token (no
    existence oracle).
    ``allowed_hosts``: ``Host`` header names served (None: any; Starlette's wildcard rules,
    e.g. ``*.example.com``). ``allowed_origins``: browser origins allowed besides the server's
    own (``scheme://host[:port]``)."""

    auth_key: str | None = None
    allowed_hosts: tuple[str, ...] | None = None
    allowed_origins: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.auth_key is not None and len(self.auth_key) < 16:
            raise ValueError("the server key must be at least 16 characters")

    @classmethod
    def for_bind(cls, host: str, auth_key: str | None = None,
                 extra_hosts: tuple[str, ...] = (), origins: tuple[str, ...] = ()
                 ) -> AccessPolicy:
        """The policy of a server bound to ``host``: on loopback only loopback names are
        served (against DNS rebinding); on another address that address plus ``extra_hosts``
        (the names users type), or any when bound to every interface without names."""
        if is_loopback(host):
            hosts: tuple[str, ...] | None = LOOPBACK_HOSTS + extra_hosts
        elif host in ("0.0.0.0", "::", ""):
            hosts = extra_hosts or None
        else:
            hosts = (host, *extra_hosts)
        return cls(auth_key, hosts, origins)

    def key_ok(self, presented: str | None) -> bool:
        """Whether ``presented`` is the server key (constant time); True when none is set."""
        return self.auth_key is None or token_matches(presented, self.auth_key)

    def origin_ok(self, origin: str | None, host: str | None) -> bool:
        """Whether a request with ``Origin: origin`` to ``Host: host`` may go on: no Origin
        (not a browser's cross-site request), the server's own origin, or an allowed one."""
        if origin is None:
            return True
        if origin.rstrip("/") in {o.rstrip("/") for o in self.allowed_origins}:
            return True
        parts = urlsplit(origin)
        return parts.scheme in ("http", "https") and bool(host) and parts.netloc == host


#: what the page loads from the UI framework (Gradio), recorded with Chromium: the page, its
#: theme, scripts, styles, fonts and icon (its config is inlined in the page)
UI_PATHS = frozenset({"/", "/theme.css", "/favicon.ico"})
UI_PREFIXES = ("/assets/", "/static/")
#: this server's own routes: the API and the page's JS/CSS
OWN_PREFIXES = ("/api/", "/ws-static/")


def page_only(app: FastAPI) -> None:
    """Answer 404 to every route of the mounted UI framework that the page does not load.

    NOTE: Gradio serves, to anyone, its API schema (``/gradio_api/info``, ``/openapi.json``,
    ``/gradio_api/openapi.json``), its config (``/config``: its version among the rest),
    uploads to a temporary folder (``/gradio_api/upload``), its event queue, login and
    monitoring routes: none of them is used by this page (it has no Gradio events: the steering
    goes over WebRTC and WebSocket), and each would be one more door on an exposed server. An
    allow list, so that a Gradio upgrade adding routes adds none here."""

    @app.middleware("http")
    async def ui_page_only(request: Request, call_next):
        path = request.url.path
        if path.startswith(OWN_PREFIXES) or (request.method in ("GET", "HEAD") and (
                path in UI_PATHS or path.startswith(UI_PREFIXES))):
            return await call_next(request)
        return JSONResponse({"error": "not found"}, status_code=404)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


