"""Settings as data and ``--set``: each world's ``stream_config.json``, overrides validated
against the config dataclass, retired settings, documented fields, and the commands that take
them (one-line errors, exit 2, before a model loads)."""

import dataclasses
import json

import pytest
import torch

from worldstream.app import cli
from worldstream.engine.backends.builtin import BuiltinConfig, builtin_config
from worldstream.engine.backends.settings import (
    RETIRED_AT,
    field_docs,
    load_settings,
    parse_overrides,
)
from worldstream.engine.backends.stream_config import StreamConfig
from worldstream.engine.backends.wan.backend import WanConfig
from worldstream.engine.worlds.catalog import world


@pytest.mark.parametrize("cls", [StreamConfig, BuiltinConfig, WanConfig])
def test_every_field_is_documented_and_every_doc_is_a_field(cls):
    docs = field_docs(cls)
    assert list(docs) == [f.name for f in dataclasses.fields(cls)]
    assert all(len(doc) > 10 for doc in docs.values()), [k for k, v in docs.items() if not v]


def test_the_avatar_settings_file_holds_its_world_values():
    """The avatar's file, read as a config: the values its model card names (neutral action =
    no key, neutral, silent = id 4; the head direction kept; dead zone 16, gate 32-80 levels,
    two pose steps of 1/32), coerced to the fields' types."""
    got = load_settings(BuiltinConfig, world("avatar").assets)
    assert got["neutral_action"] == 4 and got["kept_factors"] == (0,)
    assert got["residual_gate"] == (32.0, 80.0) and isinstance(got["residual_gate"][0], float)
    assert got["residual_deadzone"] == 16.0 and got["window_pose_tolerance"] == 2 / 32
    assert got["world_noise"] is False and got["colour_anchor"] is None
    config = builtin_config(world("avatar").assets)
    assert config.colour_prior is None and config.action_guidance == 2.0


def test_the_landscape_settings_file_is_the_landscape_config():
    config = builtin_config(world("landscape").assets)
    assert config.world_noise and config.steady_guidance_sigma == 0.6
    assert config.first_step_from_memory == 4 and config.colour_prior is not None


def test_overrides_are_coerced_to_the_field_types():
    got = parse_overrides(BuiltinConfig, [
        "guidance=3", "residual_gate=[10, 20]", "colour_anchor=null", "compile=false",
        "dtype=bfloat16", "kept_factors=[0, 2]", "attention_backend=reference"])
    assert got == {"guidance": 3.0, "residual_gate": (10.0, 20.0), "colour_anchor": None,
                   "compile": False, "dtype": torch.bfloat16, "kept_factors": (0, 2),
                   "attention_backend": "reference"}
    assert isinstance(got["guidance"], float)


@pytest.mark.parametrize("item,message", [
    ("nonsense=1", "unknown setting 'nonsense'"),
    ("guidance", "field=value"),
    ("compile=1", "compile: expected true or false"),
    ("memory_tiles=2.5", "memory_tiles: expected an integer"),
    ("residual_gate=[1, 2, 3]", "residual_gate: expected 2 values"),
    ("dtype=int8", "dtype: expected one of"),
])
def test_bad_overrides_name_the_field(item, message):
    with pytest.raises(ValueError, match=message):
        parse_overrides(BuiltinConfig, [item])


def test_retired_settings_load_at_their_off_value_and_are_refused_otherwise(tmp_path):
    (tmp_path / "stream_config.json").write_text(json.dumps(
        {"guidance": 2.0, "decode_refining": False, "world_noise_period": 0}))
    assert load_settings(BuiltinConfig, tmp_path) == {"guidance": 2.0}
    (tmp_path / "stream_config.json").write_text(json.dumps({"world_noise_hold": 8}))
    with pytest.raises(ValueError, match=f"world_noise_hold was retired.*{RETIRED_AT}"):
        load_settings(BuiltinConfig, tmp_path)
    with pytest.raises(ValueError, match="decode_refining was retired"):
        parse_overrides(BuiltinConfig, ["decode_refining=true"])
    assert parse_overrides(BuiltinConfig, ["decode_refining=false"]) == {}


def test_a_broken_settings_file_names_the_file(tmp_path):
    (tmp_path / "stream_config.json").write_text("{not json")
    with pytest.raises(ValueError, match="stream_config.json: not valid JSON"):
        load_settings(BuiltinConfig, tmp_path)
    (tmp_path / "stream_config.json").write_text(json.dumps({"guidance": "lots"}))
    with pytest.raises(ValueError, match="stream_config.json: setting guidance"):
        load_settings(BuiltinConfig, tmp_path)


@pytest.mark.parametrize("argv,message", [
    (["eval", "--set", "nonsense=1"], "unknown setting 'nonsense'"),
    (["eval", "--set", "guidance=-1", "--skip-metrics"], "setting guidance must be >= 0"),
    (["play", "--world", "avatar", "--model", "wan-causal"], "no model 'wan-causal' for world"),
    (["generate", "--model", "sim", "--set", "guidance=3"], "--set takes the builtin model"),
])
def test_bad_settings_are_one_line_and_exit_2(argv, message, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("command", ["play", "eval", "generate"])
def test_set_help_lists_every_setting_with_the_worlds_value(command, capsys):
    assert cli.main([command, "--world", "avatar", "--set", "help"]) == 0
    out = capsys.readouterr().out
    for f in dataclasses.fields(BuiltinConfig):
        assert f"\n{f.name} (" in out
    assert "residual_deadzone (float) = 16.0" in out  # the avatar's, not the default 0.0


def test_the_evaluated_settings_are_reported_and_the_colour_prior_can_be_left_out(capsys):
    """The evaluated settings name the colour prior the model streams with (the shipped
    file's numbers); ``--set colour_prior=null`` leaves it out."""
    from worldstream.engine.models.builtin.colour_prior import FILENAME, ColourPrior
    from worldstream.engine.models.builtin.loading import BUILTIN_DIR

    shipped = ColourPrior.load(BUILTIN_DIR / FILENAME)
    for extra, expect in (([], shipped), (["--set", "colour_prior=null"], None)):
        assert cli.main(["eval", "--skip-metrics", "--json", *extra]) == 0
        settings = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["settings"]
        got = settings["colour_prior"]
        if expect is None:
            assert got is None
        else:
            assert got["view_weight"] == expect.view_weight
            assert {k: tuple(v) for k, v in got["scene_means"].items()} == expect.scene_means
        assert settings["steady_guidance_sigma"] == 0.6 and settings["dtype"] == "torch.float32"


def test_the_start_up_line_states_the_resolved_config():
    from worldstream.app.startup import startup_line
    from worldstream.engine.backends.sim.backend import SimBackend
    from worldstream.engine.core.config import EngineConfig

    line = startup_line("landscape", "sim", SimBackend(), EngineConfig(max_sessions=3,
                                                                       mode="quality"))
    fields = dict(item.split("=") for item in line.removeprefix("worldstream: config ").split())
    assert fields["world"] == "landscape" and fields["model"] == "sim"
    assert fields["backend"] == "sim" and fields["mode"] == "quality"
    assert fields["steps"] == "4" and fields["chunk_frames"] == "2"
    assert fields["max_sessions"] == "3" and fields["threads"] == str(torch.get_num_threads())


def test_train_set_help_lists_the_recipe_with_the_other_items_applied(capsys):
    """``--set help`` beside other items lists the game recipe's settings with those values
    (it is not read as a setting itself) and trains nothing."""
    from worldstream.engine.training.game.train import GameTrainConfig

    argv = ["train", "--env", "ALE/Pong-v5", "--out", "/nonexistent/out", "--set", "help",
            "--set", "steps=7"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    for f in dataclasses.fields(GameTrainConfig):
        assert f"\n{f.name} (" in out
    assert "steps (int) = 7" in out
