"""One reader for every file and value (issue 74, kind 4): a bad ``--set`` value, a deeply
nested or incomplete file is one line naming it, exit 2, never a traceback."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from worldstream.app import cli
from worldstream.engine.core.reader import InputError, json_depth, read_json

DEEP = "[" * 5000 + "]" * 5000


def _one_line_exit_2(capsys, argv: list[str], *words: str) -> str:
    assert cli.main(argv) == 2, argv
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    for word in words:
        assert word in err, (word, err)
    return err


@pytest.mark.parametrize("item, word", [
    ("shift=0", "shift"), ("memory_chunks=1000000", "memory_chunks"),
    ("cpu_threads=-1", "cpu_threads"), ("cpu_threads=100000", "cpu_threads"),
    ("device=zzz", "device"), ("guidance=1e308", "guidance"), ("guidance=NaN", "guidance"),
    ("guidance=1e999", "guidance"), ("window_chunks=" + DEEP, "window_chunks"),
    ("residual_gate=[[1], [2]]", "residual_gate"), ("max_states=0", "max_states"),
])
def test_a_bad_set_value_is_one_line_and_exit_2(capsys, tmp_path, item, word):
    _one_line_exit_2(capsys, ["generate", "--set", item, "--frames", "1",
                              "--out", str(tmp_path / "x.mp4")], word)


def test_a_device_this_machine_lacks_is_refused(capsys, tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    _one_line_exit_2(capsys, ["generate", "--set", "device=cuda", "--frames", "1",
                              "--out", str(tmp_path / "x.mp4")], "device", "cuda")


def test_cpu_threads_far_past_the_cores_does_not_abort_the_process(tmp_path):
    """``cpu_threads=100000`` aborted in libgomp (no exit code of ours, a C abort)."""
    run = subprocess.run([sys.executable, "-m", "worldstream.app.cli", "generate", "--set",
                          "cpu_threads=100000", "--frames", "1", "--out",
                          str(tmp_path / "x.mp4")], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 2, run.stderr
    assert "Traceback" not in run.stderr and "cpu_threads" in run.stderr


def _savepoint_log() -> dict:
    return {"format": "worldstream-input-log/1", "model": "sim", "model_version": "0" * 64,
            "start": {"kind": "savepoint"}, "seed": 0, "prompt": "a meadow",
            "chunk_frames": 4, "steps": 2, "fps": 15, "chunks": 1, "frames": 4, "events": []}


def test_a_log_from_a_save_point_without_its_hash_is_one_line(capsys, tmp_path):
    """No ``sha256``: a TypeError at replay."""
    log = tmp_path / "log.json"
    log.write_text(json.dumps(_savepoint_log()))
    _one_line_exit_2(capsys, ["generate", "--replay", str(log), "--out",
                              str(tmp_path / "x.mp4")], "sha256", str(log))


def test_a_deeply_nested_log_is_one_line_in_generate_and_record(capsys, tmp_path):
    """RecursionError in ``generate --replay`` and ``record --from-log``."""
    log = tmp_path / "deep.json"
    log.write_text('{"model": "sim", "events": ' + DEEP + "}")
    _one_line_exit_2(capsys, ["generate", "--replay", str(log), "--out",
                              str(tmp_path / "x.mp4")], "deep.json", "nested")
    _one_line_exit_2(capsys, ["record", "--from-log", str(log), "--out",
                              str(tmp_path / "data")], "deep.json", "nested")


def test_deep_story_action_script_and_key_map_are_one_line(capsys, tmp_path):
    deep = tmp_path / "deep.json"
    deep.write_text('{"beats": ' + DEEP + "}")
    _one_line_exit_2(capsys, ["generate", "--model", "sim", "--story", str(deep), "--out",
                              str(tmp_path / "x.mp4")], "nested")
    _one_line_exit_2(capsys, ["generate", "--model", "sim", "--actions", str(deep), "--frames",
                              "1", "--out", str(tmp_path / "x.mp4")], "nested")
    from worldstream.engine.worlds.game.keymap import KeyMapError, load

    with pytest.raises(KeyMapError, match="nested deeper") as err:
        load(deep, ("NOOP", "FIRE"), "ALE/Pong-v5")
    assert str(deep) in str(err.value) and "\n" not in str(err.value)


def test_a_missing_or_oversize_file_is_named(capsys, tmp_path):
    _one_line_exit_2(capsys, ["generate", "--replay", str(tmp_path / "none.json"), "--out",
                              str(tmp_path / "x.mp4")], "none.json")
    with pytest.raises(InputError, match="limit"):
        read_json(b"[" * 100, "x", limit=10)


def test_json_depth_skips_strings_and_escapes():
    assert json_depth('{"a": "[[[[\\"{{"}') == 1
    assert json_depth(DEEP) == 5000 and json_depth("") == 0
    with pytest.raises(InputError, match="nested deeper"):
        read_json(DEEP, "deep.json", limit=2**20)
