"""The FastAPI app of the playground: the HTTP routes of the wire protocol
(``streaming/PROTOCOL.md``), the WebRTC offer route, the WebSocket fallback, the static JS/CSS
of the page, and the Gradio UI mounted last (so it never shadows an API route).

The app does not own the engine: the caller starts it before and stops it after serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path
from typing import Any

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

from fastapi import FastAPI, Request, WebSocket  # noqa: E402
from fastapi.responses import Response  # noqa: E402
from fastapi.staticfiles import StaticFiles  # noqa: E402
from starlette.middleware.trustedhost import TrustedHostMiddleware  # noqa: E402
from starlette.requests import ClientDisconnect  # noqa: E402

from worldstream.app.access import AccessPolicy, page_only  # noqa: E402
from worldstream.app.bodies import BodyLimit, UploadBudget, route_limits  # noqa: E402
from worldstream.app.errors import ApiError  # noqa: E402
from worldstream.app.metrics import metrics_body  # noqa: E402
from worldstream.app.slow_work import SlowWork  # noqa: E402
from worldstream.engine.core.api import CapacityError, EngineAPI, SessionClosedError  # noqa: E402
from worldstream.engine.core.helpers import HelperError  # noqa: E402
from worldstream.engine.studio.picture import MAX_PICTURE_BYTES  # noqa: E402
from worldstream.engine.studio.savepoint import MAX_SAVEPOINT_BYTES  # noqa: E402
from worldstream.engine.studio.story import MAX_STORY_BYTES  # noqa: E402
from worldstream.streaming import messages as m  # noqa: E402
from worldstream.streaming.limits import ClientBuckets, Limits  # noqa: E402
from worldstream.streaming.sessions import (  # noqa: E402
    BadTokenError,
    SessionManager,
    StreamSession,
    UnknownSessionError,
)
from worldstream.streaming.webrtc import (  # noqa: E402
    TooManyPeerConnectionsError,
    WebRTCTransport,
    configure_vp8_bitrate,
    vp8_bitrate,
)
from worldstream.streaming.websocket import serve_websocket  # noqa: E402

STATIC_DIR = Path(__file__).parent / "static"
#: the session prompt of a world that takes no text (a game), where the request gives none:
#: what its page sends, so input logs and replays read the same either way
NO_TEXT_PROMPT = "play"


#: the answer to a request whose session closed while it was under way
SESSION_ENDED = ApiError(404, "the session has ended", "session_id")


def _bearer(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    if header.lower().startswith("bearer "):
        return header[7:].strip()
    return None


async def _body(request: Request, model: type) -> Any:
    # NOTE: a cross-site page can POST text/plain without a CORS preflight; application/json
    # cannot be sent cross-site without one, which this server never grants
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type != "application/json":
        raise ApiError(415, "the body must be JSON sent as Content-Type: application/json",
                       "content-type")
    raw = await request.body()
    try:
        return m.parse_body(model, raw)
    except m.MessageError as err:
        raise ApiError(413 if err.code == "too_large" else 400,
                       f"{err.field}: {err.reason}", err.field) from None


def create_app(engine: EngineAPI, limits: Limits | None = None, *, ui: bool = True,
               reap_period_s: float = 5.0, recording_dir: str | Path | None = None,
               access: AccessPolicy | None = None) -> FastAPI:
    """The playground app over a started ``engine``.

    Args:
        engine: implements ``engine.core.api.EngineAPI``; already started.
        limits: session and traffic limits (defaults: ``Limits()``).
        ui: mount the Gradio page at ``/`` (tests of the API alone pass False).
        reap_period_s: how often idle sessions are looked for, s.
        recording_dir: where MP4 recordings go (a fresh temporary folder by default).
        access: server key, hosts and origins (default ``AccessPolicy()``: no key, any host;
            ``worldstream play`` passes ``AccessPolicy.for_bind``).
    """
    limits = limits or Limits()
    access = access or AccessPolicy()
    manager = SessionManager(engine, limits, recording_dir)
    if engine.media_on_replicas:  # media leaves from the replicas' hosts
        from worldstream.streaming.replica_transport import ReplicaWebRTC

        webrtc: Any = ReplicaWebRTC(manager)
    else:
        webrtc = WebRTCTransport(manager)
    # session creations and the studio routes' loads: a bounded pool of their own
    slow = SlowWork(retry_after_s=limits.retry_after_s)
    throttle = ClientBuckets(limits.auth_failures_per_s, limits.auth_failure_burst)
    creations = ClientBuckets(limits.creations_per_s, limits.creation_burst)

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI):
        async def reap() -> None:
            while True:
                await asyncio.sleep(reap_period_s)
                manager.reap_idle()

        reaper = asyncio.ensure_future(reap())
        try:
            yield
        finally:
            reaper.cancel()
            slow.close()
            manager.close_all()
            await webrtc.close_all()

    # no generated API docs: the contract is streaming/PROTOCOL*.md, and /docs would be one
    # more open door on an exposed server
    app = FastAPI(title="worldstream", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)
    app.state.manager = manager
    app.state.webrtc = webrtc
    app.state.access = access
    app.add_exception_handler(ApiError, lambda _request, err: err.response())
    # NOTE: a session may close (DELETE, the reaper) during any await of a request that
    # authenticated before it: whatever then meets the closed session is a 404, never a 500
    app.add_exception_handler(SessionClosedError, lambda _request, _err: SESSION_ENDED.response())
    # a client that goes away in the middle of its body: nothing to answer, nothing to log
    app.add_exception_handler(ClientDisconnect, lambda _request, _err: Response(status_code=400))
    # every body against its route's limit as it streams in (app/bodies.py)
    app.add_middleware(BodyLimit, limit_of=route_limits(m.MAX_HTTP_BODY_BYTES, {
        "state": MAX_SAVEPOINT_BYTES, "picture": MAX_PICTURE_BYTES, "story": MAX_STORY_BYTES}))
    if access.allowed_hosts is not None:  # against DNS rebinding (HTTP and WebSocket)
        app.add_middleware(TrustedHostMiddleware, allowed_hosts=list(access.allowed_hosts))

    @app.middleware("http")
    async def same_origin(request: Request, call_next):
        if request.url.path.startswith("/api/") and not access.origin_ok(
                request.headers.get("origin"), request.headers.get("host")):
            return ApiError(403, "cross-origin request refused", "origin").response()
        return await call_next(request)

    def client_of(conn: Request | WebSocket) -> str:
        return conn.client.host if conn.client is not None else "unknown"

    def failed_authentication(client: str) -> None:
        """Count a failed authentication of ``client``: 429 once it is past its share.

        NOTE: only requests that fail are counted and refused. Users behind one NAT, a campus
        network or a carrier's address are one client here: a request that authenticates (its
        session's token, the server key) is never refused for the failures of others."""
        if throttle.empty(client):
            raise ApiError(429, "too many failed authentications", "authorization",
                           headers={"Retry-After": "5"})
        throttle.take(client)

    def check_key(request: Request) -> None:
        if not access.key_ok(_bearer(request)):
            failed_authentication(client_of(request))
            raise ApiError(401, "this server needs its key: Authorization: Bearer <key>",
                           "authorization")

    def authorized(session_id: str, token: str | None, client: str) -> StreamSession:
        try:
            session = manager.authenticate(session_id, token)
        except UnknownSessionError:
            failed_authentication(client)
            if access.auth_key is not None:  # exposed: no existence oracle
                raise ApiError(401, "missing or wrong bearer token", "authorization") from None
            raise ApiError(404, f"unknown session {session_id!r}", "session_id") from None
        except BadTokenError as err:
            failed_authentication(client)
            raise ApiError(401, str(err), "authorization") from None
        if not session.rate.allow():
            raise ApiError(429, f"more than {limits.messages_per_s:g} requests/s",
                           headers={"Retry-After": "1"})
        return session

    @app.get("/api/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "model": engine.model_name,
                "world": engine.world, "sessions": len(manager),
                "capacity": manager.capacity}

    @app.post("/api/sessions", status_code=201)
    async def create_session(request: Request) -> dict[str, Any]:
        check_key(request)
        body = await _body(request, m.CreateSessionRequest)
        client = client_of(request)
        if creations.empty(client):  # a create/DELETE loop would cost every stream its model
            raise ApiError(429, f"more than {limits.creations_per_s:g} new sessions/s",
                           headers={"Retry-After": "1"})
        prompt = _session_prompt(body.prompt, engine.world)
        creations.take(client)
        try:
            # off the event loop and off the pool that encodes frames: the engine may encode
            # the prompt or make a game's world, a replica may be remote
            session = await slow.run(lambda: manager.create(prompt, seed=body.seed,
                                                            fps=body.fps, client=client))
        except HelperError as err:  # the helper failed, not the request: retry
            raise ApiError(503, str(err), retry_after_s=limits.retry_after_s,
                           headers={"Retry-After": str(max(1, round(limits.retry_after_s)))}
                           ) from None
        except CapacityError as err:
            raise ApiError(503, str(err), retry_after_s=err.retry_after_s,
                           headers={"Retry-After": str(max(1, round(err.retry_after_s)))}
                           ) from None
        except ValueError as err:
            raise ApiError(400, str(err), "prompt") from None
        info = session.info
        configure_vp8_bitrate(vp8_bitrate(info.width, info.height, info.fps))
        return m.SessionCreated(session_id=info.session_id, token=session.token,
                                width=info.width, height=info.height, fps=info.fps,
                                pixel_art=info.pixel_art).model_dump()

    @app.post("/api/sessions/{session_id}/offer")
    async def offer(session_id: str, request: Request) -> dict[str, str]:
        session = authorized(session_id, _bearer(request), client_of(request))
        body = await _body(request, m.OfferRequest)
        try:
            answer = await webrtc.answer(session, body.sdp)
        except TooManyPeerConnectionsError as err:
            raise ApiError(429, str(err), "sdp", headers={"Retry-After": "5"}) from None
        except TimeoutError as err:  # media on a replica being replaced: offer again
            raise ApiError(503, str(err), retry_after_s=1.0, headers={"Retry-After": "1"}
                           ) from None
        except ValueError as err:
            raise ApiError(400, f"sdp: {err}", "sdp") from None
        return {"sdp": answer.sdp, "type": answer.type}

    @app.delete("/api/sessions/{session_id}", status_code=204)
    async def delete_session(session_id: str, request: Request) -> Response:
        authorized(session_id, _bearer(request), client_of(request))
        manager.close(session_id)
        return Response(status_code=204)

    @app.get("/api/sessions/{session_id}/recording.mp4")
    async def recording(session_id: str, request: Request, token: str | None = None) -> Response:
        # a download link cannot set headers: the token may also come as ?token= (extension);
        # the recording of a closed session stays downloadable for limits.recording_keep_s
        token = _bearer(request) or token
        try:
            path = manager.kept_recording(session_id, token)
        except UnknownSessionError:  # not a closed session's: a live one's, or nothing
            path = authorized(session_id, token, client_of(request)).recording_path
        except BadTokenError as err:
            failed_authentication(client_of(request))
            raise ApiError(401, str(err), "authorization") from None
        no_recording = ApiError(404, "this session has no recording; send "
                                     "{\"type\":\"record\"}", "recording")
        if path is None:
            raise no_recording
        try:  # read whole: the writer may still be appending (fragmented MP4, valid at any cut)
            data = await asyncio.to_thread(path.read_bytes)
        except FileNotFoundError:  # none yet, or deleted (kept long enough, server stopping)
            raise no_recording from None
        return Response(data, media_type="video/mp4", headers={
            "Content-Disposition": f'attachment; filename="worldstream-{session_id}.mp4"'})

    @app.get("/api/sessions/{session_id}/frames.json")
    async def frames(session_id: str, request: Request, token: str | None = None
                     ) -> dict[str, Any]:
        # latency lab: the session's frame log (bounded ring), token also as ?token= like the
        # recording, so a plain link can download it
        session = authorized(session_id, _bearer(request) or token, client_of(request))
        return {"session_id": session_id, "fps": session.info.fps,
                **session.framelog.snapshot()}

    @app.get("/api/metrics")
    async def metrics(request: Request) -> dict[str, Any]:
        # aggregates for anyone served; a session's own figures with its token, all of them
        # with the server key (app/metrics.py)
        presented = _bearer(request)
        key_holder = access.auth_key is not None and access.key_ok(presented)
        own = None if key_holder else manager.with_token(presented)
        if not key_holder and own is None and (presented or access.auth_key):
            # a wrong credential, or none on a server with a key
            failed_authentication(client_of(request))
            raise ApiError(401, "missing or wrong bearer token", "authorization")
        shown = None if key_holder else {own.session_id} if own is not None else set()
        return metrics_body(engine.model_name, manager.capacity, manager.sessions(),
                            engine.metrics(), shown)

    @app.get("/api/sessions/{session_id}/ws-url")
    async def websocket_url(session_id: str, request: Request) -> dict[str, Any]:
        # media from the replicas: the session's WebSocket fallback leaves from its replica's
        # host too; null: this server's own route (streaming/replica_websocket.py)
        session = authorized(session_id, _bearer(request), client_of(request))
        locate = getattr(webrtc, "websocket_url", None)
        if locate is None:
            return {"ws_url": None}
        # the origins this server accepts from the page (its own under the Host the page
        # used, and the allowed ones): the replica accepts a browser's upgrade from them only
        host = request.headers.get("host")
        own = (f"http://{host}", f"https://{host}") if host else ()
        try:
            return {"ws_url": await locate(session, own + access.allowed_origins)}
        except TimeoutError as err:  # the session is being moved: ask again
            raise ApiError(503, str(err), retry_after_s=1.0, headers={"Retry-After": "1"}
                           ) from None
        except OSError:  # the replica cannot serve one: this server's route does
            return {"ws_url": None}

    @app.websocket("/api/sessions/{session_id}/ws")
    async def websocket(ws: WebSocket, session_id: str, token: str | None = None) -> None:
        try:
            if not access.origin_ok(ws.headers.get("origin"), ws.headers.get("host")):
                raise ApiError(403, "cross-origin WebSocket refused", "origin")
            session = authorized(session_id, token, client_of(ws))
        except ApiError as err:
            await ws.send_denial_response(err.response())
            return
        await serve_websocket(manager, session, ws)  # the limit, then accepts

    from worldstream.app import world_routes

    uploads = UploadBudget(limits.uploads_per_session, limits.upload_budget_bytes,
                           limits.retry_after_s)
    app.include_router(world_routes.router(engine, authorized, client_of, _bearer, uploads,
                                           slow))

    # NOTE: not /static: Gradio serves its own fonts and scripts there, and a mount of ours
    # would shadow them (404s in the page)
    app.mount("/ws-static", StaticFiles(directory=STATIC_DIR), name="ws-static")
    if ui:
        from worldstream.app.ui import mount_ui

        page_only(app)  # of the UI framework's routes, only what the page loads
        mount_ui(app, engine.model_name, engine.world)
    return app


def _session_prompt(prompt: str, world: str) -> str:
    """The prompt a new session starts with: ``prompt``, or for a world that takes no text
    (``world == "game"``) :data:`NO_TEXT_PROMPT` when it is blank or absent. ApiError 400
    (field ``prompt``) for a blank prompt of a text world."""
    if prompt.strip():
        return prompt
    if world == "game":
        return NO_TEXT_PROMPT
    raise ApiError(400, "prompt must be a non-empty string (this world takes text)", "prompt")
