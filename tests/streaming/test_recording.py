"""MP4 recording: frames in order, H.264, and a playable file when the writer dies mid-stream."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import av
import numpy as np

from worldstream.engine.core.api import Frame, FrameSlot
from worldstream.streaming.recording import Recorder

ROOT = Path(__file__).resolve().parents[2]


def _frame(i: int) -> Frame:
    rgb = np.zeros((47, 64, 3), np.uint8)   # odd height: padded to 48
    rgb[:, : 2 + i] = 200                  # a bar growing one column per frame
    return Frame("s", i, rgb, -1, 0, i // 2)


def _decoded(path: Path) -> list[np.ndarray]:
    with av.open(str(path)) as container:
        assert container.streams.video[0].codec_context.name == "h264"
        return [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]


def _bar_width(rgb: np.ndarray) -> int:
    return int((rgb[20, :, 0] > 100).sum())


def test_recording_keeps_every_frame_in_order(tmp_path):
    slot = FrameSlot(64)
    recorder = Recorder(slot, tmp_path / "r.mp4", fps=10).start()
    for i in range(25):
        slot.put(_frame(i))
    path = recorder.stop(timeout=30)               # queued frames are written before the end
    assert recorder.error is None and recorder.frames_written == 25
    frames = _decoded(path)
    assert len(frames) == 25 and frames[0].shape == (48, 64, 3)
    assert [_bar_width(f) for f in frames] == [2 + i for i in range(25)]


_WRITER = """
import sys, time
sys.path.insert(0, {root!r})
from tests.streaming.test_recording import _frame
from worldstream.engine.core.api import FrameSlot
from worldstream.streaming.recording import Recorder
slot = FrameSlot(64)
recorder = Recorder(slot, {path!r}, fps=10).start()
for i in range(45):
    slot.put(_frame(i))
    time.sleep(0.01)
while recorder.frames_written < 45:
    time.sleep(0.01)
print("written", flush=True)
time.sleep(60)
"""


def test_killed_writer_leaves_a_playable_file(tmp_path):
    path = tmp_path / "killed.mp4"
    proc = subprocess.Popen([sys.executable, "-c", _WRITER.format(root=str(ROOT), path=str(path))],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "written"
    finally:
        os.kill(proc.pid, signal.SIGKILL)   # no stop(), no trailer: an abrupt end
        proc.wait(10)
    frames = _decoded(path)
    # a fragment closes at each keyframe (one a second = 10 frames): at most the last second
    # and the encoder's few frames in flight are lost
    assert len(frames) >= 30
    assert [_bar_width(f) for f in frames] == [2 + i for i in range(len(frames))]


def test_recorder_rejects_bad_fps(tmp_path):
    try:
        Recorder(FrameSlot(1), tmp_path / "x.mp4", fps=0)
    except ValueError as err:
        assert "fps" in str(err)
    else:
        raise AssertionError("fps=0 accepted")
