"""``worldstream eval`` arguments: ``--guidance-chunks`` takes a count or ``all`` (every chunk
guided), ``--steady-guidance-sigma`` a noise level or ``off``; both refuse anything else before
loading a model."""

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


@pytest.mark.parametrize("text,value", [("off", "off"), ("0.6", 0.6), ("1", 1.0)])
def test_steady_guidance_sigma_takes_a_level_or_off(text, value):
    args = cli.build_parser().parse_args(["eval", "--steady-guidance-sigma", text])
    assert args.steady_guidance_sigma == value


@pytest.mark.parametrize("text", ["0", "1.5", "never"])
def test_steady_guidance_sigma_refuses_other_values(text, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.build_parser().parse_args(["eval", "--steady-guidance-sigma", text])
    assert exc.value.code == 2 and "--steady-guidance-sigma" in capsys.readouterr().err
