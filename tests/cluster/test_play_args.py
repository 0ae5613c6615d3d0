"""``worldstream play``'s scale-out arguments (issue 55): the emulated model is named a
simulation in the help, and arguments that go together are refused apart, in one line."""

from __future__ import annotations

import pytest

from worldstream.app import cli, cmd_play


def test_the_help_names_the_emulated_model_a_simulation(capsys):
    with pytest.raises(SystemExit):
        cli.main(["play", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "emulated (a SIMULATION of a GPU model" in text
    assert "--media-from {front,replica}" in text and "--frame-size {128x128,832x480}" in text


@pytest.mark.parametrize("argv,message", [
    (["play", "--model", "sim", "--frame-size", "832x480"], "--frame-size goes with --model "
                                                            "emulated"),
    (["play", "--model", "emulated", "--media-from", "replica"], "--media-from replica goes "
                                                                 "with --replicas"),
])
def test_arguments_that_go_together_are_refused_apart(argv, message, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("argv,want", [
    (["play", "--replicas", "2"], "replica"),  # the page offers again after a failover
    (["play", "--replicas", "1-3", "--media-from", "front"], "front"),
    (["play"], "front"),
])
def test_media_leaves_from_the_replicas_by_default_with_replicas(argv, want):
    assert cmd_play.media_from(cli.build_parser().parse_args(argv)) == want
