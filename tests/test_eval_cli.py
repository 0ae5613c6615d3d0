"""``worldstream eval`` arguments: ``--guidance-chunks`` takes a count or ``all`` (every chunk
guided), ``--steady-guidance-sigma`` a noise level or ``off``; both refuse anything else before
loading a model."""

import pytest

from worldstream.app import cli


@pytest.mark.parametrize("option,text,value", [
    ("--guidance-chunks", "all", "all"), ("--guidance-chunks", "0", 0),
    ("--guidance-chunks", "30", 30), ("--steady-guidance-sigma", "off", "off"),
    ("--steady-guidance-sigma", "0.6", 0.6), ("--steady-guidance-sigma", "1", 1.0)])
def test_takes_a_number_or_its_word(option, text, value):
    args = cli.build_parser().parse_args(["eval", option, text])
    assert getattr(args, option[2:].replace("-", "_")) == value


@pytest.mark.parametrize("option,text", [
    ("--guidance-chunks", "-1"), ("--guidance-chunks", "every"), ("--guidance-chunks", "2.5"),
    ("--steady-guidance-sigma", "0"), ("--steady-guidance-sigma", "1.5"),
    ("--steady-guidance-sigma", "never")])
def test_refuses_other_values(option, text, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.build_parser().parse_args(["eval", option, text])
    assert exc.value.code == 2 and option in capsys.readouterr().err
