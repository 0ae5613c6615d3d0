"""The control conversation of one connection, shared by both transports: validate client
messages (size, rate, schema), hand steering to the engine, answer pings, start/stop recording,
and turn engine events, frames and telemetry into server messages.

Nothing here blocks: engine calls only enqueue commands, the event queue is polled with
``get_nowait``.
"""

from __future__ import annotations

import asyncio
import queue
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

from worldstream.engine.core.api import Event, Frame, SessionClosedError
from worldstream.streaming import messages as m
from worldstream.streaming.frames import jpeg_data_url
from worldstream.streaming.sessions import SessionManager, StreamSession

Send = Callable[[dict[str, Any]], Awaitable[None]]


class ControlChannel:
    """One connection's control messages. ``send`` delivers a JSON-ready dict to the client."""

    def __init__(self, manager: SessionManager, session: StreamSession, send: Send):
        self.manager, self.session, self._send = manager, session, send
        self._events: queue.Queue | None = None  # the session's events, once pumped

    async def handle_text(self, raw: str | bytes) -> Any | None:
        """Process one client message. Returns the validated message when the transport must
        act on it itself (``next``), else None. Rejections are answered with ``error``."""
        self.manager.touch(self.session)
        try:
            message, rejection = m.parse_client_message(
                raw, self.manager.engine.wire_keys), None
        except m.MessageError as err:
            message, rejection = None, err
        try:
            # flow control (``next``) is exempt: its credits are capped by the transport
            if not isinstance(message, m.NextMessage) and not self.session.rate.allow():
                limits = self.manager.limits
                raise m.MessageError("rate_limited", "message",
                                     f"more than {limits.messages_per_s:g} messages/s "
                                     f"(burst {limits.message_burst})",
                                     getattr(message, "seq", None))
            if rejection is not None:
                raise rejection
            return await self._dispatch(message)
        except m.MessageError as err:
            await self._send(err.to_message())
        except SessionClosedError:  # closed by a DELETE or the reaper while this was under way
            await self._send(m.MessageError("session_closed", "message", "the session has ended",
                                            getattr(message, "seq", None)).to_message())
        return None

    async def _dispatch(self, message: Any) -> Any | None:
        match message:
            case m.NextMessage():
                return message
            case m.PingMessage():
                await self._send(m.PongMessage(seq=message.seq, t=message.t,
                                               server_t=time.time() * 1000).model_dump())
            case m.RecordMessage(on=True):
                self.manager.start_recording(self.session)
                await self._send(m.EventMessage(kind="recording", seq=message.seq,
                                                on=True).model_dump())
            case m.RecordMessage():
                path = self.manager.stop_recording(self.session)
                await self._send(m.EventMessage(
                    kind="recording", seq=message.seq, on=False,
                    url=f"/api/sessions/{self.session.session_id}/recording.mp4" if path else None,
                ).model_dump())
            case _:
                try:
                    self.manager.engine.submit(self.session.session_id, m.to_command(message))
                except ValueError as err:  # the engine refused a value (e.g. rewind too far)
                    raise m.MessageError("rejected", message.type, str(err),
                                         message.seq) from None
        return None

    def frame_message(self, frame: Frame, rtp_ts: int) -> dict[str, Any]:
        """The ``frame`` metadata message of ``frame`` sent with pts ``rtp_ts``; records it in
        the session's telemetry and frame log."""
        queue_ms = (time.perf_counter_ns() - frame.t_ready_ns) / 1e6 if frame.t_ready_ns else None
        self.session.telemetry.record(frame.chunk_index, frame.stages_ms, queue_ms or 0.0)
        self.session.framelog.record(frame, rtp_ts,
                                     None if queue_ms is None else round(queue_ms, 3))
        return m.FrameMessage(
            index=frame.index, rtp_ts=rtp_ts, action_seq=frame.action_seq,
            prompt_version=frame.prompt_version, stages_ms=frame.stages_ms,
            action_t=frame.action_t_ms, chunk_index=frame.chunk_index,
            queue_ms=None if queue_ms is None else round(queue_ms, 3),
        ).model_dump(exclude_none=True)

    def stats_message(self, buffer_depth: int, dropped: int) -> dict[str, Any]:
        try:
            budget = self.manager.engine.latency_budget(self.session.session_id)
        except SessionClosedError:
            budget = None
        return m.StatsMessage(buffer_depth=buffer_depth, dropped=dropped, budget=budget,
                              **self.session.telemetry.snapshot()).model_dump()

    async def pump(self, depth: Callable[[], tuple[int, int]], period_s: float = 1.0,
                   poll_s: float = 0.02) -> None:
        """Forward engine events as they come and a ``stats`` message every ``period_s``;
        ``depth()`` gives the transport's (slot depth, dropped frames). Runs until cancelled
        or, at once, when the session has closed."""
        try:
            events = self._events = self.manager.engine.events(self.session.session_id)
        except SessionClosedError:
            return
        next_stats = time.monotonic() + period_s
        while True:
            try:
                event = events.get_nowait()
            except queue.Empty:
                event = None
            if event is not None:
                await self._send(event_message(event))
                continue
            if time.monotonic() >= next_stats:
                next_stats += period_s
                await self._send(self.stats_message(*depth()))
            await asyncio.sleep(poll_s)

    async def flush_until_closed(self, timeout_s: float, poll_s: float = 0.02) -> None:
        """Forward the session's remaining events until its ``closed`` event has gone out or
        ``timeout_s`` passed (the engine emits ``closed`` on its own thread, just after the
        close that ends the transport)."""
        events, deadline = self._events, time.monotonic() + timeout_s
        while events is not None:
            try:
                event = events.get_nowait()
            except queue.Empty:
                if time.monotonic() >= deadline:
                    return
                await asyncio.sleep(poll_s)
                continue
            await self._send(event_message(event))
            if event.kind == "closed":
                return


def event_message(event: Event) -> dict[str, Any]:
    """The server message for an engine event: ``error`` for errors, ``preview`` (thumbnails as
    JPEG data URLs) for previews, ``event`` for the other kinds."""
    payload = dict(event.payload)
    if event.kind == "error":
        return m.ErrorMessage(seq=payload.get("seq"), code=str(payload.get("code", "engine_error")),
                              field=payload.get("field"),
                              message=str(payload.get("message", payload))
                              ).model_dump(exclude_none=True)
    if event.kind == "preview":
        frames = payload.pop("frames", [])
        if "branch" in payload:  # one event per branch, ``frames`` = that branch's frames
            branches = [{"branch": payload.pop("branch"), "image": _thumbnail(frames)}]
        else:  # one event for all branches, ``frames`` = one entry per branch
            branches = [{"branch": i, "image": _thumbnail(f)} for i, f in enumerate(frames)]
        return m.PreviewMessage(seq=payload.get("seq"), fork_id=payload.get("fork_id"),
                                branches=branches).model_dump()
    extra = {k: v for k, v in payload.items() if k not in ("type", "kind")}
    return m.EventMessage(kind=event.kind, **extra).model_dump()


def _thumbnail(frames: object) -> str:
    """JPEG data URL of the last frame of ``frames`` (one ``(H, W, 3)`` array or several)."""
    rgb = np.asarray(frames)
    return jpeg_data_url(rgb[-1] if rgb.ndim == 4 else rgb)
