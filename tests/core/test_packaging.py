"""The install maps every source folder under the ``worldstream`` namespace (issue 13)."""

import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOP_LEVEL = ("app", "bench", "engine", "kernels", "streaming")


def _config() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_every_package_folder_is_installed_under_the_namespace():
    on_disk = {
        "worldstream." + ".".join(init.parent.relative_to(ROOT).parts)
        for top in TOP_LEVEL
        for init in (ROOT / top).rglob("__init__.py")
    }
    assert set(_config()["packages"]) == on_disk


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
