"""``worldstream eval`` arguments: ``--guidance-chunks`` takes a count or ``all`` (every chunk
guided), and refuses anything else before loading a model."""

import pytest

from worldstream.app import cli


@pytest.mark.parametrize("text,value", [("all", "all"), ("0", 0), ("30", 30)])
def test_guidance_chunks_takes_a_count_or_all(text, value):
    args = cli.build_parser().parse_args(["eval", "--guidance-chunks", text])
    assert args.guidance_chunks == value


@pytest.mark.parametrize("text", ["-1", "every", "2.5"])
def test_guidance_chunks_refuses_other_values(text, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.build_parser().parse_args(["eval", "--guidance-chunks", text])
    assert exc.value.code == 2 and "--guidance-chunks" in capsys.readouterr().err
