"""No machine paths or generated files in the tree: the tracked files name no absolute folder
of the machine that made them (a run's or data folder under /work, /root or /home; a /tmp path
recorded as data in a JSON file), and no file a tool generates at run time is tracked."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: a machine's folder: /work/..., /root/..., /home/<user>/... (not /proc, /dev/null, /usr/bin)
MACHINE = re.compile(r"(?<![\w.~-])/(?:work|root|home/[\w.-]+)/[\w.-]")
#: a /tmp path recorded as a value in a JSON file (code may name a temporary file; data not)
TMP_IN_JSON = re.compile(r'"/tmp/')
#: files tools write into the working folder while they run
GENERATED = ("_vizdoom.ini",)


def _tracked() -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
    return [name for name in out.stdout.decode().split("\0") if name]


def test_no_tracked_file_names_a_machine_path():
    found = []
    for name in _tracked():
        path = ROOT / name
        if name == "tests/test_no_machine_paths.py" or not path.is_file():
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:  # binary: weights, pictures
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if MACHINE.search(line) or (name.endswith(".json") and TMP_IN_JSON.search(line)):
                found.append(f"{name}:{number}: {line.strip()[:120]}")
    assert not found, "machine paths in tracked files:\n" + "\n".join(found)


def test_the_pattern_tells_machine_paths_from_legit_ones():
    for text in ('"out": "/work/runs/pong-b"', "python /work/runs/probe_eval.py",
                 '"json": "/root/out/x.json"', "/home/alice/data"):
        assert MACHINE.search(text), text
    for text in ("#!/usr/bin/env python", "/proc/cpuinfo", "> /dev/null", "/usr/bin/chromium",
                 "https://example.com/work/x", "~/work/x", "runs/work/x"):
        assert not MACHINE.search(text), text


def test_no_generated_file_is_tracked():
    tracked = {Path(name).name for name in _tracked()}
    assert not tracked & set(GENERATED)
