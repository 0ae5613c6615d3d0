"""Pixel-art worlds on the wire: a game's frames leave as their nearest-neighbour upscale (each
game pixel a block of its own colour after VP8 or JPEG), other worlds' frames as they are."""

from __future__ import annotations

import asyncio
import dataclasses
import io

import av
import numpy as np
import pytest
from aiortc.codecs.vpx import Vp8Encoder, vp8_depayload
from PIL import Image

from tests.fixtures.engine import EchoBackend
from worldstream.engine.backends.avatar.sim import AvatarSimBackend
from worldstream.engine.backends.game.sim import GameEnvBackend
from worldstream.engine.backends.game.world import GameWorldBackend
from worldstream.engine.backends.sim.backend import SimBackend
from worldstream.engine.core.api import Frame, FrameSlot
from worldstream.engine.core.backend import ChunkJob, backend_info
from worldstream.engine.core.engine import Engine
from worldstream.streaming.frames import upscale_nearest, video_scale
from worldstream.streaming.webrtc import FrameTrack, pixel_art_frame
from worldstream.streaming.websocket import _encode

BREAKOUT = "ALE/Breakout-v5"


@pytest.fixture(scope="module")
def breakout_frame() -> np.ndarray:
    """The real game's 64x64 frame after a serve: grey walls, six rows of coloured bricks
    (two pixels tall), the score digits, the paddle."""
    backend = GameEnvBackend(env=BREAKOUT, rewind_chunks=2)
    try:
        state = backend.new_state("", 3)
        fire = backend.key_action(frozenset({"fire"}))
        (result,) = backend.generate([ChunkJob(state, [fire] * 4, 2)])
        assert result.error is None, result.error
        return result.frames[-1]
    finally:
        backend.close()


def _vp8_round_trip(rgb: np.ndarray, scale: int, frames: int = 4) -> np.ndarray:
    """``rgb`` streamed as the session's track sends it (``FrameTrack``, aiortc's VP8 encoder
    at the server's 1 Mbit/s, ``frames`` times), decoded with PyAV: the last decoded frame,
    RGB (chroma upsampled by repetition, to judge what was sent, not a player's filter)."""
    slot, encoder = FrameSlot(8), Vp8Encoder()
    track = FrameTrack(slot, scale=scale)
    encoder.target_bitrate = 1_000_000
    decoder = av.CodecContext.create("libvpx", "r")
    decoded = []
    for i in range(frames):
        slot.put(Frame("s", i, rgb, -1, 0, i))
        payloads, _ = encoder.encode(asyncio.run(track.recv()), force_keyframe=i == 0)
        data = b"".join(vp8_depayload(p) for p in payloads)
        decoded += decoder.decode(av.Packet(data))
    track.stop()
    return decoded[-1].reformat(format="rgb24", interpolation="POINT").to_ndarray()


def _brick_mask(frame: np.ndarray) -> np.ndarray:
    """Pixels of the bricks: saturated colours (neither black nor the grey of the walls)."""
    f = frame.astype(int)
    return (f.max(axis=2) - f.min(axis=2)) > 60


def test_video_scale_is_even_and_reaches_256_pixels_for_pixel_art_only():
    assert video_scale(64, 64, pixel_art=True) == 4
    assert video_scale(160, 210, pixel_art=True) == 2
    assert video_scale(100, 100, pixel_art=True) == 4      # 3 would split chroma samples
    assert video_scale(256, 320, pixel_art=True) == 1
    assert video_scale(64, 64, pixel_art=False) == 1
    with pytest.raises(ValueError, match="even"):
        pixel_art_frame(np.zeros((8, 8, 3), np.uint8), 3)


def test_pixel_art_track_sends_the_nearest_neighbour_upscale_exactly():
    """Before the encoder: the track's yuv420p frame is the nearest-neighbour upscale of the
    game's frame converted to 4:2:0 by 2x2 averages (every chroma sample inside one pixel)."""
    rgb = np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    slot = FrameSlot(2)
    slot.put(Frame("s", 0, rgb, -1, 0, 0))
    sent = asyncio.run(FrameTrack(slot, scale=4).recv())
    expected = av.VideoFrame.from_ndarray(upscale_nearest(rgb, 4), format="rgb24").reformat(
        format="yuv420p", interpolation="AREA")
    assert (sent.width, sent.height, sent.format.name) == (256, 256, "yuv420p")
    assert np.array_equal(sent.to_ndarray(), expected.to_ndarray())


def test_pixel_art_vp8_frame_keeps_each_game_pixel_a_uniform_block(breakout_frame):
    """After VP8 (encoded, decoded): each 4x4 block of the real Breakout frame is its game
    pixel's colour, within a few levels: no colour bleeds from a brick into the black above
    it, into the brick row of another colour below it, or around the paddle. Sent at 64x64,
    as before, the same frame's bricks bled by tens of levels."""
    rgb = breakout_frame
    bricks = _brick_mask(rgb)
    assert bricks.sum() > 200, "the frame has no bricks"
    out = _vp8_round_trip(rgb, video_scale(64, 64, pixel_art=True))
    assert out.shape == (256, 256, 3)
    err = np.abs(out.astype(int) - upscale_nearest(rgb, 4).astype(int)).max(axis=2)
    blocks = err.reshape(64, 4, 64, 4).max(axis=(1, 3))     # the worst pixel of each block
    assert blocks[bricks].max() <= 12, blocks[bricks].max()
    # the black just above and below the brick rows: not tinted by the bricks
    rows = np.flatnonzero(bricks.any(axis=1))
    for row in (rows[0] - 1, rows[-1] + 1):
        assert blocks[row, bricks[rows[0]]].max() <= 12, (row, blocks[row].max())
    assert np.percentile(blocks, 99) <= 12 and blocks.max() <= 24, (
        np.percentile(blocks, 99), blocks.max())

    before = _vp8_round_trip(rgb, 1)                          # how it was sent before
    bled = np.abs(before.astype(int) - rgb.astype(int)).max(axis=2)
    assert bled[bricks].max() > 30 and bled.max() > 2 * blocks.max()


def test_pixel_art_jpeg_frame_keeps_each_game_pixel_a_uniform_block(breakout_frame):
    """The WebSocket fallback's JPEG: upscaled the same way before encoding."""
    rgb = breakout_frame
    out = np.asarray(Image.open(io.BytesIO(_encode(rgb, 4))).convert("RGB"))
    assert out.shape == (256, 256, 3)
    err = np.abs(out.astype(int) - upscale_nearest(rgb, 4).astype(int)).max(axis=2)
    blocks = err.reshape(64, 4, 64, 4).max(axis=(1, 3))     # the worst pixel of each block
    assert blocks.max() <= 32 and blocks[_brick_mask(rgb)].max() <= 32, blocks.max()
    before = np.asarray(Image.open(io.BytesIO(_encode(rgb, 1))).convert("RGB"))
    assert before.shape == (64, 64, 3)                        # other worlds: as before
    assert np.abs(before.astype(int) - rgb.astype(int)).max() > 2 * blocks.max()


class _PixelArtEcho(EchoBackend):
    def info(self):
        return dataclasses.replace(super().info(), pixel_art=True)


def test_sessions_say_whether_their_world_is_pixel_art():
    """A backend that declares pixel art (the game worlds do) makes sessions that say so; the
    built-in worlds do not, and their frames leave as before (rgb24, the frame's own size)."""
    assert Engine(_PixelArtEcho()).create_session("play", seed=0).pixel_art is True
    for backend in (GameWorldBackend, GameEnvBackend):
        assert backend.pixel_art is True, backend
    for backend in (SimBackend(), AvatarSimBackend(), EchoBackend()):
        assert backend_info(backend).pixel_art is False, backend
    info = Engine(EchoBackend()).create_session("a green meadow with ponds", seed=0)
    assert info.pixel_art is False and video_scale(info.width, info.height, info.pixel_art) == 1
    rgb = np.random.default_rng(1).integers(0, 256, (48, 64, 3), np.uint8)
    slot = FrameSlot(2)
    slot.put(Frame("s", 0, rgb, -1, 0, 0))
    sent = asyncio.run(FrameTrack(slot).recv())
    assert sent.format.name == "rgb24" and np.array_equal(sent.to_ndarray(), rgb)
