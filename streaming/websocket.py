"""WebSocket fallback transport (for networks where UDP fails): JSON control messages as text,
frames as binary ``[4-byte big-endian header length][JSON frame header][JPEG]``, pull-based
flow control (one frame per ``{"type":"next"}`` credit), paced like the video track."""

from __future__ import annotations

import asyncio
import contextlib
import json
import struct
from typing import Any

import numpy as np
from starlette.responses import JSONResponse
from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from worldstream.engine.core.api import SessionClosedError
from worldstream.streaming import messages as m
from worldstream.streaming.control import ControlChannel
from worldstream.streaming.frames import encode_jpeg, upscale_nearest, video_scale
from worldstream.streaming.limits import websockets_per_client
from worldstream.streaming.pacing import Pacer, SlotClosedError
from worldstream.streaming.sessions import SessionManager, StreamSession

#: frames the connection's slot holds (frames past due are dropped), as for the video track
WS_SLOT_FRAMES = 8
#: the most ``next`` credits a client can bank: asking far ahead would defeat flow control
MAX_CREDITS = 4
JPEG_QUALITY = 85
#: the close of a socket whose session ended (a DELETE, the idle reaper, the engine ending it):
#: RFC 6455's normal closure, with this reason
SESSION_ENDED_CODE = 1000
SESSION_ENDED_REASON = "the session has ended"
#: how long the session's ``closed`` event is waited for before that close, s
CLOSE_FLUSH_S = 0.25
#: how often a connection looks whether its session's slot closed, s
WATCH_S = 0.05


def pack_frame(header: dict[str, Any], jpeg: bytes) -> bytes:
    """One binary frame message: ``>I`` header length, UTF-8 JSON header, JPEG bytes."""
    head = json.dumps(header).encode()
    return struct.pack(">I", len(head)) + head + jpeg


def unpack_frame(data: bytes) -> tuple[dict[str, Any], bytes]:
    """Inverse of :func:`pack_frame`; raises ValueError on a truncated message."""
    if len(data) < 4:
        raise ValueError("frame message shorter than its 4-byte header length")
    (size,) = struct.unpack(">I", data[:4])
    if len(data) < 4 + size:
        raise ValueError(f"frame header of {size} bytes is truncated")
    return json.loads(data[4:4 + size]), data[4 + size:]


def _encode(rgb: np.ndarray, scale: int) -> bytes:
    """A frame's JPEG; a pixel-art world's (``scale`` > 1) scaled up with nearest neighbour
    first, with full chroma.

    NOTE: measured on a Breakout frame at 4x: 4:2:0 (the decoder's smoothed chroma) left brick
    edges off by up to 70 levels, 4:4:4 by 25 (8.6 KB a frame instead of 6.2 KB)."""
    if scale == 1:
        return encode_jpeg(rgb, JPEG_QUALITY)
    return encode_jpeg(upscale_nearest(rgb, scale), JPEG_QUALITY, full_chroma=True)


class WebSocketConnection:
    """Serves one WebSocket for ``session`` until the client leaves or the session closes.

    Made before the upgrade is accepted: it subscribes to the session's frames, takes one of
    its WebSocket places and registers with the session's close, or raises
    SessionClosedError (the upgrade is then refused with 404); :meth:`serve` accepts.

    NOTE: the session's close (from any thread) closes the connection's slot, and the
    connection watches its slot, not its frame sender: a client holding no ``next`` credit
    never asks the slot for a frame, and would otherwise keep a socket of a deleted session
    open (pongs and ``stats`` every second) for as long as it liked (issue 64). The socket
    closes with ``SESSION_ENDED_CODE`` after the session's ``closed`` event."""

    def __init__(self, manager: SessionManager, session: StreamSession, ws: WebSocket):
        self.manager, self.session, self.ws = manager, session, ws
        self._send_lock = asyncio.Lock()
        self._credits = asyncio.Semaphore(0)
        self._banked = 0
        self.control = ControlChannel(manager, session, self._send_json)
        info = session.info
        self._scale = video_scale(info.width, info.height, info.pixel_art)
        self.slot = manager.engine.subscribe(session.session_id, WS_SLOT_FRAMES)
        self._loop = asyncio.get_running_loop()
        try:
            manager.add_closer(session, self._closer)
        except SessionClosedError:
            self.slot.close()
            raise
        session.websockets += 1

    def _closer(self) -> None:
        """The session closed (any thread): close the slot, which ends :meth:`serve`."""
        with contextlib.suppress(RuntimeError):  # the loop has stopped: nothing to end
            self._loop.call_soon_threadsafe(self.slot.close)

    async def _send_json(self, message: dict[str, Any]) -> None:
        async with self._send_lock:
            await self.ws.send_text(json.dumps(message))

    async def _send_frames(self) -> None:
        pacer = Pacer(self.slot)
        while True:
            await self._credits.acquire()
            self._banked -= 1
            frame, pts = await pacer.next()
            header = self.control.frame_message(frame, pts)
            jpeg = await asyncio.to_thread(_encode, frame.rgb, self._scale)
            async with self._send_lock:
                await self.ws.send_bytes(pack_frame(header, jpeg))

    async def _receive(self) -> None:
        while True:
            message = await self.ws.receive()
            if message["type"] == "websocket.disconnect":
                return
            if message.get("text") is None:
                await self._send_json(m.MessageError(
                    "malformed", "message", "binary messages are not accepted").to_message())
                continue
            result = await self.control.handle_text(message["text"])
            if isinstance(result, m.NextMessage) and self._banked < MAX_CREDITS:
                self._banked += 1
                self._credits.release()

    async def _until_slot_closed(self) -> None:
        while not self.slot.closed:
            await asyncio.sleep(WATCH_S)

    async def _close_ended(self) -> None:
        """The session ended: its last events (``closed``), then the protocol's close."""
        with contextlib.suppress(Exception):  # the client may be gone meanwhile
            await self.control.flush_until_closed(CLOSE_FLUSH_S)
        with contextlib.suppress(Exception):
            await self.ws.close(SESSION_ENDED_CODE, SESSION_ENDED_REASON)

    async def serve(self) -> None:
        """Accept the upgrade and serve until the client leaves or the session closes (the
        close may come during any await here: then the slot is closed and this ends)."""
        attached = False
        tasks: list[asyncio.Future] = []
        try:
            await self.ws.accept()
            self.manager.attach(self.session)
            attached = True
            tasks = [asyncio.ensure_future(self._receive()),
                     asyncio.ensure_future(self._send_frames()),
                     asyncio.ensure_future(self.control.pump(lambda: (
                         len(self.slot), self.slot.dropped + self.slot.stale))),
                     asyncio.ensure_future(self._until_slot_closed())]
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if not isinstance(task.exception(), SlotClosedError | WebSocketDisconnect |
                                  type(None)):
                    raise task.exception()
        except (SessionClosedError, WebSocketDisconnect):
            pass  # the session closed before it attached; the client left during the accept
        finally:
            # NOTE: everything is released before the first await: this task may be
            # cancelled there (the server stopping), and what follows an await would not run
            for task in tasks:
                task.cancel()
            ended = self.slot.closed  # the session's close (or the engine's) closed it
            self.slot.close()
            self.manager.remove_closer(self.session, self._closer)
            self.session.websockets -= 1
            if attached:
                self.manager.detach(self.session)
            if self.ws.application_state == WebSocketState.CONNECTED:
                if ended:
                    await self._close_ended()
                else:
                    with contextlib.suppress(Exception):
                        await self.ws.close()


def refusal(status: int, message: str, field: str) -> JSONResponse:
    """The HTTP answer refusing an upgrade: ``{"error": message, "field": field}``."""
    return JSONResponse({"error": message, "field": field}, status_code=status)


async def serve_websocket(manager: SessionManager, session: StreamSession, ws: WebSocket
                          ) -> None:
    """Serve the upgrade ``ws`` of an authenticated ``session`` until the client leaves or the
    session closes: the one path of the front end's route and a replica's
    (``streaming.replica_websocket``). Refused, never upgraded, with 429 while the session
    holds ``limits.websockets_per_session`` connections here or the client's address
    ``limits.websockets_per_client`` (over all sessions), 404 when it closed meanwhile."""
    limit = manager.limits.websockets_per_session
    if session.websockets >= limit:
        await ws.send_denial_response(refusal(
            429, f"this session holds {limit} WebSocket connections; close one first",
            "session_id"))
        return
    client = ws.client.host if ws.client is not None else "unknown"
    if not manager.open_websocket(client):
        await ws.send_denial_response(refusal(
            429, f"this address holds {websockets_per_client(manager.limits)} WebSocket "
                 "connections; close one first", "session_id"))
        return
    try:
        try:
            connection = WebSocketConnection(manager, session, ws)  # holds its place
        except SessionClosedError:
            await ws.send_denial_response(refusal(404, "the session has ended", "session_id"))
            return
        await connection.serve()  # accepts
    finally:
        manager.close_websocket(client)
