"""The install maps every source folder under the ``worldstream`` namespace (issue 13); the
package list is derived (issue 73: a new folder needs no edit of ``pyproject.toml``)."""

import importlib.util
import runpy
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOP_LEVEL = ("app", "bench", "engine", "kernels", "streaming")


def _config() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def _on_disk() -> set[str]:
    return {
        "worldstream." + ".".join(init.parent.relative_to(ROOT).parts)
        for top in TOP_LEVEL
        for init in (ROOT / top).rglob("__init__.py")
    }


def test_every_package_folder_is_installed_under_the_namespace():
    setup = runpy.run_path(str(ROOT / "setup.py"))  # not as __main__: setup() is not called
    assert setup["TOP_LEVEL"] == TOP_LEVEL
    assert set(setup["packages"]()) == _on_disk()
    assert "packages" not in _config()  # nothing hand-kept beside the derived list


def test_a_new_folder_is_a_package_without_an_edit(tmp_path):
    # the derivation over a copy of one top folder with a folder added
    (tmp_path / "engine" / "backends" / "noise").mkdir(parents=True)
    for folder in ("engine", "engine/backends", "engine/backends/noise"):
        (tmp_path / folder / "__init__.py").write_text("")
    for top in TOP_LEVEL[:1] + TOP_LEVEL[2:]:
        (tmp_path / top).mkdir(exist_ok=True)
    setup = runpy.run_path(str(ROOT / "setup.py"))
    assert "worldstream.engine.backends.noise" in setup["packages"](tmp_path)


def test_every_package_imports_under_the_namespace():
    missing = [name for name in sorted(_on_disk()) if importlib.util.find_spec(name) is None]
    assert missing == []


def test_top_level_folders_map_to_namespaced_packages():
    assert _config()["package-dir"] == {f"worldstream.{top}": top for top in TOP_LEVEL}


def test_no_source_imports_a_bare_top_level_name():
    # a bare `import engine` would load a second copy of a module beside worldstream.engine
    offenders = []
    for top in (*TOP_LEVEL, "tests"):
        for path in (ROOT / top).rglob("*.py"):
            for number, line in enumerate(path.read_text().splitlines(), 1):
                words = line.split()
                if len(words) >= 2 and words[0] in ("import", "from") and (
                    words[1].split(".")[0] in TOP_LEVEL
                ):
                    offenders.append(f"{path.relative_to(ROOT)}:{number}")
    assert offenders == []


def test_no_installed_distribution_claims_a_top_level_folder_name():
    # the folders are importable by their bare names wherever the repo root is on sys.path
    # (pytest, `python -m bench`) and then shadow an installed package of the same name: with
    # Hugging Face's `kernels` installed (transformers 5.25 requires it) transformers imported
    # our kernels/ as theirs and no diffusers model loaded (pyproject.toml pins it out)
    claimed = {top: sorted(set(packages_distributions().get(top, [])) - {"worldstream"})
               for top in TOP_LEVEL}
    assert {top: d for top, d in claimed.items() if d} == {}
