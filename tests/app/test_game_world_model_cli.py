"""A game's learned world on the command line: ``generate --env ID --model-path DIR`` and its
``--replay``; a folder trained for another game, a missing folder, an env without a shipped
model: one clear line each (two for ``play``, which adds how to play the game itself), exit
2."""

from __future__ import annotations

import json
import shutil

import av
import pytest

from tests.fixtures.game_world import tiny_world_folder
from tests.fixtures.tiny_game import TINY
from tests.studio.test_replay import record_session
from worldstream.app.cli import main
from worldstream.engine.backends.game import world as game_world
from worldstream.engine.backends.game.world import GameWorldBackend
from worldstream.engine.core.api import ActionCommand
from worldstream.engine.core.config import EngineConfig
from worldstream.engine.core.engine import Engine


@pytest.fixture(scope="module")
def folder():
    return tiny_world_folder()


def _frames(path) -> int:
    with av.open(str(path)) as container:
        return sum(1 for _ in container.decode(video=0))


def test_generate_plays_the_learned_world_and_replays_its_log(folder, tmp_path, capsys):
    out = tmp_path / "gen.mp4"
    script = tmp_path / "keys.json"
    script.write_text(json.dumps({"events": [{"frame": 0, "keys": ["left"]},
                                             {"frame": 5, "keys": ["right"]}]}))
    for extra in ([], ["--actions", str(script)]):
        assert main(["generate", "--env", TINY, "--model-path", str(folder), "--frames", "12",
                     "--fps", "30", "--out", str(out), *extra]) == 0
        summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert (summary["world"], summary["model"]) == (TINY, "builtin")
        assert summary["sessions"][0]["frames"] == 12 == _frames(out)
    # a live session's input log through `generate --replay` (the log names the model)
    config = EngineConfig(max_sessions=1, fps=60, chunk_frames=2)
    plan = [(2, ActionCommand(1, 0.0, frozenset({"right"})))]
    with Engine(GameWorldBackend(env=TINY, path=folder), config) as engine:
        original, log = record_session(engine, "play", 4, plan, 10)
    path = tmp_path / "session.log.json"
    path.write_text(json.dumps(log))
    replayed = tmp_path / "replay.mp4"
    # the log names a module:factory game: it plays only when the command line names it too
    assert main(["generate", "--replay", str(path), "--model-path", str(folder), "--out",
                 str(replayed)]) == 2
    assert "a file never imports code" in capsys.readouterr().err
    assert main(["generate", "--replay", str(path), "--env", TINY, "--model-path",
                 str(folder), "--out", str(replayed)]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["frames"] == len(original)
    assert main(["generate", "--replay", str(path), "--env", TINY, "--model", "builtin",
                 "--out", str(replayed)]) == 2
    assert "needs --model-path DIR" in capsys.readouterr().err


def test_bad_folders_are_one_line_and_exit_2(folder, tmp_path, capsys, monkeypatch):
    other = tmp_path / "other"
    shutil.copytree(folder, other)
    meta = json.loads((other / "world.json").read_text())
    (other / "world.json").write_text(json.dumps({**meta, "env": "ALE/Breakout-v5"}))
    monkeypatch.setattr(game_world, "ASSETS", tmp_path / "assets")  # nothing shipped here
    for argv, message in (
            (["--env", TINY, "--model-path", str(other)], "a world of 'ALE/Breakout-v5', not"),
            (["--env", TINY, "--model-path", str(tmp_path / "nope")],
             f"train with `worldstream train --env {TINY} --out "),
            (["--env", TINY, "--model", "builtin"], "needs --model-path DIR"),
            (["--world", "pong"], "train with `worldstream train --env ALE/Pong-v5 --out "),
            (["--env", TINY, "--model", "sim", "--model-path", str(folder)],
             "takes no --model-path"),
            (["--env", TINY, "--model-path", str(folder), "--prompt", "a forest"],
             "no text prompt")):
        assert main(["generate", *argv, "--frames", "2", "--out",
                     str(tmp_path / "x.mp4")]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
    # play says how to play the game itself instead
    assert main(["play", "--env", TINY, "--model-path", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert f"`worldstream play --env {TINY} --model sim`" in err
    assert not (tmp_path / "x.mp4").exists()


def test_bench_quick_times_the_learned_world_through_the_engine(folder, tmp_path, capsys):
    import torch

    from worldstream.bench import quick

    out = tmp_path / "quick.json"
    threads = torch.get_num_threads()
    try:
        assert quick.main(["--env", TINY, "--model-path", str(folder), "--threads", "1",
                           "--seconds", "1", "--no-save", "--json", str(out)]) == 0
    finally:
        torch.set_num_threads(threads)
    printed = json.loads(out.read_text())
    assert json.loads(capsys.readouterr().out) == printed  # one JSON object on stdout
    for key in ("fps", "ttff_ms", "action_to_frame_ms_p50", "action_to_frame_ms_p95",
                "batched_2_sessions_aggregate_ratio", "batched_2_sessions_generate_ratio",
                "hardware", "model", "settings", "weights", "resolution"):
        assert key in printed, key
    assert "speedup_vs_recompute" not in printed  # the landscape's baselines do not apply
    assert printed["resolution"] == "16x16" and set(printed["stages_ms"]) >= {"predict"}
    assert printed["fps"] > 0 and printed["actions_measured"] > 0
    assert printed["action_to_frame_ms_p50"] <= printed["action_to_frame_ms_p95"]
    below = printed["details"]["generate_one_vs_two"]
    assert printed["batched_2_sessions_generate_ratio"] == pytest.approx(
        2 * below["ms_1"] / below["ms_2"], rel=1e-6)
