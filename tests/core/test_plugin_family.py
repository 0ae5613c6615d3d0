"""A family installed from outside (issue 73): the example package under
``tests/fixtures/example_family`` (a distribution declaring a ``worldstream.families`` entry
point) pip-installed into a temporary folder, found at start-up, played through ``worldstream
generate`` as a world of its own and resolved by ``play``; a broken plugin is one line naming
its distribution and entry point, and the shipped families still load. The replicas' side is
``tests/cluster/test_plugin_replicas.py``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import av
import numpy as np
import pytest

from worldstream.app import cli, game_args
from worldstream.engine.core import registry

EXAMPLE = Path(__file__).resolve().parents[1] / "fixtures" / "example_family"


def install_example(where: Path) -> Path:
    """The example family pip-installed (offline: no index, no build isolation, no
    dependencies) into ``where/site``; returns that folder. Built from a copy, so the
    checkout gets no build/ or egg-info."""
    source = where / "src"
    shutil.copytree(EXAMPLE, source, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    site = where / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                    "--no-build-isolation", "--target", str(site), str(source)],
                   check=True, capture_output=True, timeout=300)
    return site


@pytest.fixture(scope="session")
def example_site(tmp_path_factory) -> Path:
    return install_example(tmp_path_factory.mktemp("example_family"))


def _with_path(folder: Path):
    """``folder`` on ``sys.path`` and the registry read again; undone (and read again) by the
    returned callable."""
    sys.path.insert(0, str(folder))
    registry.discover()

    def undo() -> None:
        sys.path.remove(str(folder))
        for name in [m for m in sys.modules if m.split(".")[0] in ("worldstream_noise",
                                                                    "misspelt_family")]:
            del sys.modules[name]
        registry.discover()

    return undo


@pytest.fixture
def noise_family(example_site):
    undo = _with_path(example_site)
    yield example_site
    undo()


def test_an_installed_family_is_found_by_a_fresh_process(example_site):
    # discovery reads installed metadata at every start: a new process, nothing kept
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(example_site),
                                                        os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run(
        [sys.executable, "-c", "import json; from worldstream.engine.core import registry; "
         "print(json.dumps([list(registry.FAMILIES), registry.OWN_WORLD_MODELS, "
         "registry.PLUGIN_ERRORS]))"], env=env, capture_output=True, text=True, check=True,
        timeout=120)
    families, own, errors = json.loads(out.stdout)
    assert "noise" in families and "noise" in own and errors == []
    assert {"builtin", "sim"} <= set(families)  # the shipped rows came the same way
    # and without the package on the path, it is gone at the next start
    out = subprocess.run(
        [sys.executable, "-c", "from worldstream.engine.core import registry; "
         "print('noise' in registry.FAMILIES)"], capture_output=True, text=True, check=True,
        timeout=120)
    assert out.stdout.strip() == "False"


def test_an_installed_own_world_family_plays_through_generate(noise_family, tmp_path):
    out, script = tmp_path / "noise.mp4", tmp_path / "right.json"
    script.write_text(json.dumps({"events": [{"frame": 0, "keys": ["right"]}]}))
    assert cli.main(["generate", "--model", "noise", "--frames", "12", "--fps", "10",
                     "--actions", str(script), "--out", str(out)]) == 0
    with av.open(str(out)) as container:
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    assert len(frames) == 12 and frames[0].shape == (48, 64, 3)
    # the white square: the brightest 8x8 block of each frame, 2 px right a frame
    corners = []
    for frame in frames:
        grey = frame.mean(-1)
        sums = np.lib.stride_tricks.sliding_window_view(grey, (8, 8)).sum((-1, -2))
        corners.append(np.unravel_index(sums.argmax(), sums.shape))
    assert min(frame.mean() for frame in frames) > 40  # noise, not black
    xs = [int(x) for _, x in corners]
    assert xs[-1] - xs[0] >= 16 and {int(y) for y, _ in corners} == {20}, corners


def test_an_own_world_family_is_resolved_by_play(noise_family):
    args = cli.build_parser().parse_args(["play", "--model", "noise"])
    choice = game_args.resolve(args)
    assert (choice.world, choice.model, choice.backend, choice.env) == ("noise", "noise",
                                                                        "noise", None)
    assert choice.family.own_world and choice.family.replicas
    bad = cli.build_parser().parse_args(["play", "--model", "noise", "--world", "landscape"])
    with pytest.raises(ValueError, match="its own world"):
        game_args.resolve(bad)


def _dist(site: Path, name: str, entry: str, module: str | None = None) -> None:
    """A hand-made installed distribution ``name`` with one family entry point ``entry``
    (``NAME = module:attr``), and the module's source where given."""
    info = site / f"{name.replace('-', '_')}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[worldstream.families]\n{entry}\n")
    if module is not None:
        (site / f"{entry.split('=')[1].strip().split(':')[0]}.py").write_text(module)


def test_a_broken_plugin_is_one_line_and_the_shipped_families_still_load(tmp_path, capsys):
    _dist(tmp_path, "broken-family", "broken = no_such_module:FAMILIES")
    _dist(tmp_path, "misspelt-family", "misspelt = misspelt_family:FAMILIES",
          "from worldstream.engine.core.family import Family\n"
          "FAMILIES = (Family('spelt', 'misspelt_family:make', pixelart=True),)\n")
    undo = _with_path(tmp_path)
    try:
        lines = capsys.readouterr().err.strip().splitlines()
        assert registry.PLUGIN_ERRORS == lines and len(lines) == 2
        broken, misspelt = sorted(lines)
        assert "'broken'" in broken and "'broken-family'" in broken
        assert "ModuleNotFoundError" in broken
        assert "'misspelt'" in misspelt and "'misspelt-family'" in misspelt
        assert "pixelart" in misspelt  # the misspelt field is named
        assert "spelt" not in registry.FAMILIES
        assert {"builtin", "sim", "game-sim"} <= set(registry.FAMILIES)
        assert registry.load_backend("sim").name == "sim"
    finally:
        undo()


def test_a_row_with_a_bad_value_is_refused_where_it_is_made():
    with pytest.raises(ValueError, match="keyed"):
        registry.Family("x", "m:f", keyed="colour")
    with pytest.raises(ValueError, match="replicas: expected a bool"):
        registry.Family("x", "m:f", replicas="yes")
    with pytest.raises(TypeError):
        registry.Family("x", "m:f", pixelart=True)  # type: ignore[call-arg]


def test_an_installed_own_world_family_is_served_by_play(noise_family, monkeypatch):
    """``worldstream play --model noise``: the engine starts on the plugin's backend and the
    page's health names its world (uvicorn replaced by one request through the app)."""
    import uvicorn
    from fastapi.testclient import TestClient

    from worldstream.streaming import webrtc

    health = {}

    def serve(app, **kwargs):
        with TestClient(app, base_url="http://127.0.0.1:7999") as client:
            health.update(client.get("/api/health").json())

    monkeypatch.setattr(uvicorn, "run", serve)
    monkeypatch.setattr(webrtc, "bind_media", lambda host: None)
    monkeypatch.setattr(webrtc, "configure_ice_consent", lambda: None)
    assert cli.main(["play", "--model", "noise", "--port", "7999"]) == 0
    assert health["model"] == "noise" and health["world"] == "landscape", health


def test_a_model_name_means_one_thing(noise_family):
    # "noise" is a world of its own: no family may make it a model of a world too
    with pytest.raises(ValueError, match="--model noise"):
        registry.register(registry.Family("noise2", "m:f", model="noise",
                                          worlds=("landscape",)))
    with pytest.raises(ValueError, match="--model sim"):
        registry.register(registry.Family("own-sim", "m:f", model="sim"))
