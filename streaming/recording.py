"""Record a session's frames to MP4 (H.264, PyAV) in a background writer thread.

The file is a fragmented MP4 (``empty_moov`` + a fragment per keyframe, one keyframe a second,
packets flushed as written), so a recording cut short by a crash or a kill is still playable up
to its last complete fragment; no index has to be written at the end.
"""

from __future__ import annotations

import threading
from fractions import Fraction
from pathlib import Path

import av
import numpy as np

from worldstream.engine.core.api import Frame, FrameSlot
from worldstream.streaming.frames import pad_even
from worldstream.streaming.pacing import VIDEO_CLOCK_HZ, pts_of

_MP4_OPTIONS = {"movflags": "frag_keyframe+empty_moov+default_base_moof", "flush_packets": "1"}


class Recorder:
    """Writes every frame taken from ``slot`` to ``path`` until :meth:`stop`.

    Args:
        slot: a slot of its own (``engine.subscribe``), so recording never steals frames from
            the live transport; a slow disk drops frames there instead of delaying the stream.
        path: the MP4 file to write (created or truncated).
        fps: the nominal frame rate (keyframe spacing). Timestamps come from each frame's
            presentation time (``Frame.present_ns``, the engine's playout clock, 90 kHz), so
            drops, stalls and fps changes play back as they were streamed; frames without one
            (``present_ns`` 0) are spaced ``1 / fps`` apart by index.
        max_frames: finish the file after this many frames (None: until :meth:`stop`).
    ``error`` holds the exception that ended the writer early, if any.
    """

    def __init__(
        self, slot: FrameSlot, path: str | Path, fps: int, max_frames: int | None = None
    ):
        if fps < 1:
            raise ValueError(f"fps must be >= 1, got {fps}")
        if max_frames is not None and max_frames < 1:
            raise ValueError(f"max_frames must be >= 1, got {max_frames}")
        self.max_frames = max_frames
        self.path = Path(path)
        self.fps = fps
        self.frames_written = 0
        self.error: Exception | None = None
        self._slot = slot
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"recorder-{self.path.name}",
                                        daemon=True)

    def start(self) -> Recorder:
        self._thread.start()
        return self

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def stop(self, timeout: float = 5.0) -> Path:
        """Write the frames already queued, finish the file, return its path (waits up to
        ``timeout`` s)."""
        self._stop.set()
        self._slot.close()
        self._thread.join(timeout)
        return self.path

    def _run(self) -> None:
        try:
            with av.open(str(self.path), "w", format="mp4", options=_MP4_OPTIONS) as container:
                stream = None
                first: Frame | None = None
                last_pts = -1
                while True:
                    # after stop(), frames already queued are still written, then the end
                    frame = (self._slot.get_nowait() if self._stop.is_set()
                             else self._slot.get(timeout=0.1))
                    if frame is None:
                        if self._stop.is_set():
                            break
                        continue
                    rgb = pad_even(frame.rgb)
                    if stream is None:
                        stream = self._add_stream(container, rgb)
                        first = frame
                    last_pts = max(self._pts(frame, first), last_pts + 1)
                    self._write(container, stream, rgb, last_pts)
                    if self.max_frames is not None and self.frames_written >= self.max_frames:
                        break
                if stream is not None:
                    for packet in stream.encode(None):
                        container.mux(packet)
        except Exception as err:  # reported through .error; the live stream goes on
            self.error = err

    def _pts(self, frame: Frame, first: Frame) -> int:
        if frame.present_ns and first.present_ns:
            return pts_of(frame.present_ns, first.present_ns)
        return round((frame.index - first.index) * VIDEO_CLOCK_HZ / self.fps)

    def _add_stream(self, container, rgb: np.ndarray):
        stream = container.add_stream("libx264", rate=self.fps)
        stream.width, stream.height = rgb.shape[1], rgb.shape[0]
        stream.pix_fmt = "yuv420p"
        stream.time_base = Fraction(1, VIDEO_CLOCK_HZ)
        stream.codec_context.time_base = Fraction(1, VIDEO_CLOCK_HZ)
        # a keyframe (hence an MP4 fragment) every second bounds what a crash can lose
        stream.codec_context.gop_size = self.fps
        stream.codec_context.options = {"preset": "veryfast", "tune": "zerolatency", "crf": "18"}
        return stream

    def _write(self, container, stream, rgb: np.ndarray, pts: int) -> None:
        video_frame = av.VideoFrame.from_ndarray(rgb, format="rgb24")
        video_frame.pts = pts
        for packet in stream.encode(video_frame):
            container.mux(packet)
        self.frames_written += 1
