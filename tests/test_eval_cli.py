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


def test_the_colour_prior_is_reported_and_can_be_left_out(capsys):
    """The evaluated settings name the colour prior the model streams with (the shipped
    file's numbers); ``--no-colour-prior`` leaves it out."""
    import json

    from worldstream.engine.models.builtin.colour_prior import FILENAME, ColourPrior
    from worldstream.engine.models.builtin.loading import BUILTIN_DIR

    shipped = ColourPrior.load(BUILTIN_DIR / FILENAME)
    for extra, expect in (([], shipped), (["--no-colour-prior"], None)):
        assert cli.main(["eval", "--skip-metrics", "--json", *extra]) == 0
        settings = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["settings"]
        got = settings["colour_prior"]
        if expect is None:
            assert got is None
        else:
            assert got["view_weight"] == expect.view_weight
            assert {k: tuple(v) for k, v in got["scene_means"].items()} == expect.scene_means
