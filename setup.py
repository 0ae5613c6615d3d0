"""setuptools' package list, derived: every folder with an ``__init__.py`` under the fixed
top-level folders, installed as ``worldstream.<folder>`` (``pyproject.toml`` maps each top
folder to its namespaced name). Everything else lives in ``pyproject.toml``."""

from pathlib import Path

from setuptools import find_packages, setup

#: the source folders, each installed as ``worldstream.<name>``
TOP_LEVEL = ("app", "bench", "engine", "kernels", "streaming")


ROOT = Path(__file__).resolve().parent


def packages(root: Path = ROOT) -> list[str]:
    """``worldstream.<top>`` and each of its subpackages (folders with an ``__init__.py``)."""
    return sorted(f"worldstream.{name}" for top in TOP_LEVEL
                  for name in (top, *(f"{top}.{sub}" for sub in find_packages(root / top))))


if __name__ == "__main__":
    setup(packages=packages())
