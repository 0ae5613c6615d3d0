"""``worldstream generate`` writes exactly the frames asked for, short runs included (issue 12:
``--frames 1`` crashed with a TypeError and left an empty MP4)."""

import json

import av
import pytest

from worldstream.app import cli


@pytest.mark.parametrize("frames", [1, 2, 5])
def test_generate_writes_exactly_the_frames_asked_for(tmp_path, capsys, frames):
    out = tmp_path / "out.mp4"
    assert cli.main(["generate", "--model", "sim", "--frames", str(frames), "--out", str(out)]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["sessions"][0]["frames"] == frames
    with av.open(str(out)) as container:
        assert sum(1 for _ in container.decode(video=0)) == frames
