"""WebRTC transport (aiortc): a paced video track per session fed from a bounded frame slot,
and the ``control`` data channel carrying steering up and per-frame metadata down."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import av
import numpy as np
from aioice import ice as aioice_ice
from aiortc import (
    MediaStreamTrack,
    RTCConfiguration,
    RTCPeerConnection,
    RTCRtpSender,
    RTCSessionDescription,
)
from aiortc.codecs import vpx
from aiortc.mediastreams import MediaStreamError

from worldstream.engine.core.api import Frame, FrameSlot, SessionClosedError
from worldstream.streaming.control import ControlChannel
from worldstream.streaming.frames import pad_even, video_scale
from worldstream.streaming.pacing import VIDEO_CLOCK_HZ, Pacer, SlotClosedError
from worldstream.streaming.sctp import bound_data_channels
from worldstream.streaming.sessions import SessionManager, StreamSession

#: frames the track's slot holds: a chunk arrives as a burst of frames, held until each is due
#: (the pacer drops frames that are past due, so this bounds memory, not delay)
TRACK_SLOT_FRAMES = 8
_TIME_BASE = Fraction(1, VIDEO_CLOCK_HZ)
#: frame messages kept for a data channel that is not open yet (a few seconds of video)
EARLY_FRAME_MESSAGES = 256
_ALL_HOST_ADDRESSES = aioice_ice.get_host_addresses


def vp8_bitrate(width: int, height: int, fps: int) -> int:
    """Target VP8 bitrate, bit/s: 0.3 bit per pixel per frame, at least 1 Mbit/s (generated
    frames are noisy and small frames need a floor), at most 10 Mbit/s."""
    return int(min(10_000_000, max(1_000_000, 0.3 * width * height * fps)))


def configure_vp8_bitrate(bitrate: int) -> None:
    """Raise aiortc's VP8 start bitrate (500 kbit/s) and ceiling (1.5 Mbit/s).

    NOTE: aiortc has no public bitrate setting. Its encoder reads these two module constants:
    ``DEFAULT_BITRATE`` when an encoder is created, ``MAX_BITRATE`` to clamp the receiver's REMB
    estimates. Setting them is the least invasive lever: no private attribute of the sender, no
    patched function, congestion control (REMB) keeps working between ``MIN_BITRATE`` and the
    new ceiling. It is process-wide, which fits: one server streams one model at one size."""
    vpx.DEFAULT_BITRATE = bitrate
    vpx.MAX_BITRATE = max(bitrate * 2, vpx.MAX_BITRATE)


def bind_media(host: str | None) -> None:
    """Offer ICE host candidates on ``host`` only (the HTTP server's bind address), so media
    sockets listen where the page is served and nowhere else; None or a wildcard address
    (``0.0.0.0``, ``::``) restores every interface.

    NOTE: aiortc has no setting for this. Its ICE agent (aioice) gathers host candidates from
    every interface except loopback through the module function
    ``aioice.ice.get_host_addresses``, which this replaces process-wide (one server, one bind
    address; the same kind of lever as :func:`configure_vp8_bitrate`). A loopback-bound server
    thus offers 127.0.0.1, which aioice would otherwise never offer."""
    if host is None or host in ("0.0.0.0", "::", ""):
        aioice_ice.get_host_addresses = _ALL_HOST_ADDRESSES
        return
    address = "127.0.0.1" if host == "localhost" else host.strip("[]")
    v6 = ":" in address

    def only_bound(use_ipv4: bool, use_ipv6: bool) -> list[str]:
        return [address] if (use_ipv6 if v6 else use_ipv4) else []

    aioice_ice.get_host_addresses = only_bound


def configure_ice_consent(interval_s: float = 2.0, failures: int = 3) -> None:
    """Notice a vanished peer sooner: aioice checks ICE consent (RFC 7675) every
    ``CONSENT_INTERVAL`` (5 s) and fails the connection after ``CONSENT_FAILURES`` (6) misses,
    so a crashed tab (no DTLS close) would hold its session's place for half a minute. Module
    constants, read at each check: process-wide, like
    :func:`configure_vp8_bitrate`. With the defaults here: ~6 s."""
    aioice_ice.CONSENT_INTERVAL = interval_s
    aioice_ice.CONSENT_FAILURES = failures


def pixel_art_frame(rgb: np.ndarray, scale: int) -> av.VideoFrame:
    """``(H, W, 3)`` uint8 RGB -> a ``(H * scale, W * scale)`` yuv420p frame, each pixel a
    ``scale`` x ``scale`` block (nearest neighbour; ``scale`` even: ``frames.video_scale``).

    NOTE: scaled and converted in one swscale call (POINT): ~0.5 ms for 64x64 -> 256x256,
    exactly ``frames.upscale_nearest`` then a 2x2-average to 4:2:0, so every chroma sample lies
    inside one game pixel. Left to the encoder, the RGB -> YUV conversion (swscale, bilinear)
    filters chroma across samples: a brick bled up to 20 levels into the block beside it even
    when upscaled 4x (tests/streaming/test_pixel_art.py)."""
    if scale % 2:
        raise ValueError(f"scale must be even (whole chroma samples per pixel), got {scale}")
    height, width = rgb.shape[:2]
    return av.VideoFrame.from_ndarray(np.ascontiguousarray(rgb), format="rgb24").reformat(
        width=width * scale, height=height * scale, format="yuv420p", interpolation="POINT")


class FrameTrack(MediaStreamTrack):
    """A video track whose ``recv()`` returns the session's frames paced by a
    :class:`~streaming.pacing.Pacer` (each frame at its presentation time, latest wins, 90 kHz
    pts from 0).
    ``on_frame(frame, pts)`` runs just before each frame is returned, so the ``frame``
    metadata message leaves before the frame. ``scale``: each frame is scaled up by this
    integer factor with nearest neighbour (a pixel-art world's, ``frames.video_scale``)."""

    kind = "video"

    def __init__(self, slot: FrameSlot,
                 on_frame: Callable[[Frame, int], None] | None = None, scale: int = 1):
        super().__init__()
        self.slot = slot
        self._pacer = Pacer(slot)
        self._on_frame = on_frame
        self.scale = scale

    async def recv(self) -> av.VideoFrame:
        try:
            frame, pts = await self._pacer.next(lambda: self.readyState == "live")
        except SlotClosedError as err:
            raise MediaStreamError(str(err)) from None
        if self._on_frame is not None:
            self._on_frame(frame, pts)
        if self.scale > 1:
            video_frame = pixel_art_frame(frame.rgb, self.scale)
        else:
            video_frame = av.VideoFrame.from_ndarray(pad_even(frame.rgb), format="rgb24")
        video_frame.pts, video_frame.time_base = pts, _TIME_BASE
        return video_frame

    def stop(self) -> None:
        self.slot.close()
        super().stop()


def _prefer_vp8(transceiver: Any) -> None:
    codecs = RTCRtpSender.getCapabilities("video").codecs
    vp8 = [c for c in codecs if c.mimeType.lower() == "video/vp8"]
    others = [c for c in codecs if c.mimeType.lower() != "video/vp8"]
    transceiver.setCodecPreferences(vp8 + others)


class TooManyPeerConnectionsError(Exception):
    """The session holds ``limits.peer_connections_per_session`` peer connections (HTTP 429)."""


def ice_ufrag(sdp: str) -> str | None:
    """The offer's ICE username fragment (``a=ice-ufrag:``), None when it has none."""
    for line in sdp.splitlines():
        if line.startswith("a=ice-ufrag:"):
            return line.split(":", 1)[1].strip()
    return None


@dataclass
class _Peer:
    """A peer connection's owner and state, for the per-session cap and attach/detach."""

    session: StreamSession
    ufrag: str | None
    closer: Callable[[], Any]
    timeout: asyncio.TimerHandle | None = None  # closes it if it never connects
    attached: bool = False


class WebRTCTransport:
    """Answers offers and owns the peer connections. ``ice_servers``: none by default (the
    playground serves loopback/LAN; aiortc would otherwise contact a public STUN server).

    Bounded per session (offers whose peer never connects hold UDP sockets, until the process
    runs out of descriptors): at most
    ``limits.peer_connections_per_session`` pending or connected peer connections, one not
    connected within ``limits.offer_connect_timeout_s`` is closed, and an offer replaying the
    ICE credentials of a live one is refused. A connected peer attaches its session
    (generation runs), a closed one detaches it."""

    def __init__(self, manager: SessionManager, ice_servers: list | None = None):
        self.manager = manager
        self._ice_servers = ice_servers or []
        self._pcs: dict[RTCPeerConnection, _Peer] = {}

    def peer_connections(self, session: StreamSession) -> int:
        return sum(p.session is session for p in self._pcs.values())

    async def answer(self, session: StreamSession, sdp: str) -> RTCSessionDescription:
        """Negotiate a peer connection for ``session`` from the client's offer; raises
        ValueError when the offer has no video m-line, replays a live offer or aiortc cannot
        negotiate it (a malformed SDP: the client's error, answered 400, not the server's),
        TooManyPeerConnectionsError when the session holds its share, SessionClosedError when
        the session closes before the answer is ready (nothing of the peer is kept)."""
        limits = self.manager.limits
        if self.peer_connections(session) >= limits.peer_connections_per_session:
            raise TooManyPeerConnectionsError(
                f"this session holds {limits.peer_connections_per_session} peer connections; "
                "close one (or wait for it to time out) first")
        ufrag = ice_ufrag(sdp)
        if ufrag is not None and any(p.session is session and p.ufrag == ufrag
                                     for p in self._pcs.values()):
            raise ValueError("this offer was already answered (its ICE credentials are in use)")
        pc = RTCPeerConnection(RTCConfiguration(iceServers=self._ice_servers))
        loop = asyncio.get_running_loop()

        def closer() -> None:
            loop.call_soon_threadsafe(self._close_soon, pc)

        try:
            self.manager.add_closer(session, closer)  # from here the session's close closes it
            slot = self.manager.engine.subscribe(session.session_id, TRACK_SLOT_FRAMES)
        except SessionClosedError:
            self.manager.remove_closer(session, closer)
            await pc.close()
            raise
        self._pcs[pc] = _Peer(session, ufrag, closer, loop.call_later(
            limits.offer_connect_timeout_s, self._close_if_unconnected, pc))
        channels: list[Any] = []
        # frame messages of frames sent before the data channel opens (video often starts
        # first): delivered when it opens, so every frame keeps its metadata
        early: deque[dict[str, Any]] = deque(maxlen=EARLY_FRAME_MESSAGES)
        control = ControlChannel(self.manager, session, self._sender(channels))

        def on_frame(frame: Frame, pts: int) -> None:
            message = control.frame_message(frame, pts)
            if not self._send_now(channels, message):
                early.append(message)

        info = session.info
        track = FrameTrack(slot, on_frame=on_frame,
                           scale=video_scale(info.width, info.height, info.pixel_art))

        @pc.on("datachannel")
        def on_datachannel(channel: Any) -> None:
            if channel.label != "control":
                return
            channels.append(channel)
            while early:
                self._send_now(channels, early.popleft())
            pump = asyncio.ensure_future(control.pump(
                lambda: (len(track.slot), track.slot.dropped + track.slot.stale)))

            @channel.on("message")
            async def on_message(raw: Any) -> None:
                await control.handle_text(raw)

            channel.on("close", pump.cancel)

        @pc.on("connectionstatechange")
        async def on_state() -> None:
            peer = self._pcs.get(pc)
            if pc.connectionState == "connected" and peer is not None and not peer.attached:
                try:
                    self.manager.attach(session)
                    peer.attached = True
                except SessionClosedError:
                    await self._close(pc)
            if pc.connectionState in ("failed", "closed"):
                await self._close(pc)

        try:
            await pc.setRemoteDescription(RTCSessionDescription(sdp=sdp, type="offer"))
            video = [t for t in pc.getTransceivers() if t.kind == "video"]
            if not video:
                raise ValueError("the offer has no video m-line")
            _prefer_vp8(video[0])
            pc.addTrack(track)  # attaches to the offered recvonly transceiver
            bound_data_channels(pc)
            await pc.setLocalDescription(await pc.createAnswer())
            if session.closed:  # during the awaits above (the closer may be closing it already)
                raise SessionClosedError(session.session_id)
        except Exception as err:
            track.stop()  # not attached to the connection yet: its slot must close too
            await self._close(pc)
            if session.closed:
                raise SessionClosedError(session.session_id) from None
            if isinstance(err, ValueError):
                raise
            # aiortc's parser raises KeyError, IndexError, ...
            raise ValueError(f"the offer could not be negotiated ({type(err).__name__})") from err
        return pc.localDescription

    @staticmethod
    def _sender(channels: list[Any]):
        async def send(message: dict[str, Any]) -> None:
            WebRTCTransport._send_now(channels, message)
        return send

    @staticmethod
    def _send_now(channels: list[Any], message: dict[str, Any]) -> bool:
        """Send on every open channel; False when none is open."""
        sent = False
        for channel in channels:
            if channel.readyState == "open":
                channel.send(json.dumps(message))
                sent = True
        return sent

    def _close_soon(self, pc: RTCPeerConnection) -> None:
        asyncio.ensure_future(self._close(pc))

    def _close_if_unconnected(self, pc: RTCPeerConnection) -> None:
        if pc in self._pcs and pc.connectionState != "connected":
            self._close_soon(pc)

    async def _close(self, pc: RTCPeerConnection) -> None:
        peer = self._pcs.pop(pc, None)
        if peer is not None:
            self.manager.remove_closer(peer.session, peer.closer)
            if peer.timeout is not None:
                peer.timeout.cancel()  # it would hold the connection for its whole delay
            if peer.attached:
                self.manager.detach(peer.session)
            for sender in pc.getSenders():
                if sender.track is not None:
                    sender.track.stop()
            with contextlib.suppress(Exception):
                await pc.close()

    async def close_all(self) -> None:
        await asyncio.gather(*(self._close(pc) for pc in list(self._pcs)))
