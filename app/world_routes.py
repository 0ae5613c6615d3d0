"""HTTP routes of a session's world: its input log, save points (download and
load), a start from a picture, a storyboard played live; and the world's controls (a game's
key map). Contract:
``streaming/PROTOCOL_EXTENSIONS.md`` ("Stories, save points and replays").

Each route authenticates like the other session routes (bearer token; the downloads also take
``?token=``), validates its body before anything changes (a bad file is one 4xx with one line,
the session goes on as it was), then hands the work to the engine thread and waits for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from worldstream.app.bodies import UploadBudget
from worldstream.app.errors import ApiError
from worldstream.app.slow_work import SlowWork
from worldstream.engine.core.api import CapacityError, RunsStudio, SessionClosedError
from worldstream.engine.core.helpers import HelperError
from worldstream.engine.studio.picture import MAX_PICTURE_BYTES, PictureError
from worldstream.engine.studio.savepoint import MAX_SAVEPOINT_BYTES, SavepointError
from worldstream.engine.studio.story import MAX_STORY_BYTES, parse_story

#: how long a route waits for the engine thread, s (it runs between two chunks)
_ENGINE_WAIT_S = 60.0


async def _read_capped(request: Request, limit: int, error,
                       take: Callable[[int], None] | None = None) -> bytearray:
    """The request body in one buffer, refused with 413 past ``limit`` bytes (before reading
    it all when Content-Length says so); ``take(n)`` is told of each chunk before it is held
    (an upload budget's: raises to refuse it, ``app.bodies.UploadBudget``)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise error(413, f"{declared} bytes exceeds the limit of {limit} bytes", "body")
    # NOTE: one buffer grown in place as the bytes arrive (a list of chunks joined at the end
    # held the body twice; a save point's arrays are read as views of it,
    # engine.studio.savepoint). Not allocated from Content-Length: a client that declares
    # the limit and sends nothing would pin that much memory per request.
    body = bytearray()
    async for chunk in request.stream():
        if len(body) + len(chunk) > limit:
            raise error(413, f"the body exceeds the limit of {limit} bytes", "body")
        if take is not None:
            take(len(chunk))
        body += chunk
    return body


def _content_type(request: Request) -> str:
    return request.headers.get("content-type", "").split(";")[0].strip().lower()


def router(engine: Any, authorized: Callable, client_of: Callable,
           bearer: Callable, uploads: UploadBudget | None = None,
           slow: SlowWork | None = None) -> APIRouter:
    """The routes, as a FastAPI router over ``engine``; ``authorized(session_id, token,
    client)`` is the server's session check (raises its ApiError); ``uploads`` bounds the
    uploads in flight (default: one per session, ``Limits().upload_budget_bytes`` in all);
    ``slow`` runs their loads (default: a pool of its own, ``app.slow_work``)."""
    routes = APIRouter()
    slow = slow or SlowWork()
    if uploads is None:
        from worldstream.streaming.limits import Limits

        defaults = Limits()
        uploads = UploadBudget(defaults.uploads_per_session, defaults.upload_budget_bytes)
    from worldstream.engine.studio import worldio

    def studio(op: str, session_id: str, *args: Any) -> Any:
        """The engine's future of studio operation ``op`` (``engine.studio.worldio``); the
        scale-out router runs it on the session's replica (``RayEngine.studio``)."""
        if isinstance(engine, RunsStudio):
            return engine.studio(op, session_id, *args)
        return getattr(worldio, op)(engine, session_id, *args)

    async def wait(start: Callable[[], Any], field: str) -> Any:
        """Run ``start()`` (validates, returns the engine's future) in the slow-work pool (it
        may decode a large picture, replay a game or hash the model once; never the pool that
        encodes frames) and await its result, mapping failures to ApiError."""
        try:
            future = await slow.run(start, field)
            return await asyncio.wait_for(asyncio.wrap_future(future), _ENGINE_WAIT_S)
        except HelperError as err:  # a helper process failed, not the file: retry
            raise ApiError(503, str(err), field, retry_after_s=slow.retry_after_s,
                           headers={"Retry-After": "2"}) from None
        except (SavepointError, PictureError) as err:
            raise ApiError(400, str(err), field) from None
        except CapacityError as err:
            raise ApiError(503, str(err), field, retry_after_s=err.retry_after_s,
                           headers={"Retry-After": str(max(1, round(err.retry_after_s)))}
                           ) from None
        except SessionClosedError:
            raise ApiError(404, "the session has ended", "session_id") from None
        except TimeoutError:
            raise ApiError(503, "the engine did not answer in time", field,
                           headers={"Retry-After": "5"}) from None
        except ValueError as err:
            raise ApiError(400, str(err), field) from None

    def session_of(session_id: str, request: Request, token: str | None = None):
        return authorized(session_id, bearer(request) or token, client_of(request))

    @contextlib.asynccontextmanager
    async def upload(session_id: str, request: Request, types: tuple[str, ...], refusal: str,
                     limit: int) -> AsyncIterator[bytearray]:
        """The body sent to session ``session_id`` (checked first), for the body of the
        ``async with``: 415 with ``refusal`` when its Content-Type is none of ``types``, 413
        past ``limit`` bytes; its bytes count against the upload budget (``uploads``) as they
        arrive and until the ``async with`` ends (429/503/413 past it)."""
        session_of(session_id, request)
        if _content_type(request) not in types:
            raise ApiError(415, refusal, "content-type")
        async with uploads.slot(session_id) as ticket:
            yield await _read_capped(request, limit, ApiError, ticket.take)

    @routes.get("/api/controls")
    async def controls() -> dict[str, Any]:
        # the page's keys (public, like /api/health): a game world's key map, or keys null
        # (the direction keys: WASD / arrows)
        found = engine.controls or {}
        # mouse: whether the model takes mouse motion (the page captures the pointer only then;
        # a front end over replicas has no backend: its replicas told it)
        return {"world": engine.world, "keys": found.get("keys"), "mouse": bool(engine.mouse),
                **{k: v for k, v in found.items() if k not in ("keys", "mouse")}}

    @routes.get("/api/sessions/{session_id}/log")
    async def input_log(session_id: str, request: Request, token: str | None = None
                        ) -> Response:
        session_of(session_id, request, token)
        log = await wait(lambda: studio("export_log", session_id), "session_id")
        return JSONResponse(log, headers={
            "Content-Disposition": f'attachment; filename="worldstream-{session_id}.log.json"'})

    @routes.get("/api/sessions/{session_id}/state")
    async def save_state(session_id: str, request: Request, token: str | None = None
                         ) -> Response:
        session_of(session_id, request, token)
        data = await wait(lambda: studio("save", session_id), "session_id")
        return Response(data, media_type="application/octet-stream", headers={
            "Content-Disposition": f'attachment; filename="worldstream-{session_id}.wsstate"'})

    @routes.post("/api/sessions/{session_id}/state")
    async def load_state(session_id: str, request: Request) -> dict[str, Any]:
        async with upload(session_id, request, ("application/octet-stream",),
                          "send the save file as Content-Type: application/octet-stream",
                          MAX_SAVEPOINT_BYTES) as data:  # counted until the load is done
            return await wait(lambda: studio("load", session_id, data), "state")

    @routes.post("/api/sessions/{session_id}/picture")
    async def picture(session_id: str, request: Request) -> dict[str, Any]:
        async with upload(session_id, request, ("image/png", "image/jpeg"),
                          "send the picture as Content-Type: image/png or image/jpeg",
                          MAX_PICTURE_BYTES) as data:
            return await wait(lambda: studio("start_from_picture", session_id, data),
                              "picture")

    @routes.post("/api/sessions/{session_id}/story")
    async def story(session_id: str, request: Request) -> dict[str, Any]:
        async with upload(session_id, request, ("application/json",),
                          "the body must be JSON sent as Content-Type: application/json",
                          MAX_STORY_BYTES) as raw:
            try:
                board = await slow.run(lambda: parse_story(raw), "story")
            except ValueError as err:
                raise ApiError(400, str(err), "story") from None
        result = await wait(lambda: studio("play_story", session_id, board), "story")
        return {**result, "story": json.loads(board.model_dump_json())}

    return routes
