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


def test_a_model_that_cannot_load_is_one_line_and_exit_2(capsys):
    # issue 13: wan-causal without --model-path raised a TypeError past the CLI's handler
    assert cli.main(["generate", "--model", "wan-causal", "--frames", "1", "--out", "x.mp4"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--model-path" in err[0]
    assert cli.main(["generate", "--model", "sim", "--model-path", "x", "--out", "x.mp4"]) == 2
    assert "takes no --model-path" in capsys.readouterr().err


def test_every_option_of_every_command_has_help_text():
    import argparse

    parser = cli.build_parser()
    assert "developer" not in (parser.description or "") and "``" not in parser.description
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    missing = [f"{name} {a.option_strings or a.dest}" for name, command in sub.choices.items()
               for a in command._actions if not a.help]
    assert missing == []
    assert "wan-causal" in sub.choices["play"].format_help()


def test_an_output_folder_that_does_not_exist_is_an_error(tmp_path, capsys):
    out = tmp_path / "missing" / "out.mp4"
    assert cli.main(["generate", "--model", "sim", "--frames", "2", "--out", str(out)]) == 2
    assert "does not exist" in capsys.readouterr().err and not out.exists()
