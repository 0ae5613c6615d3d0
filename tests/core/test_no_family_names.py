"""``app/``, ``streaming/`` and ``engine/core/`` name no model family (issue 73): every fact
about a family is on its row (``engine.core.family.Family``) or its ``BackendInfo``, so a
family added by a folder or a plugin needs no edit there. A family name written as a string
constant in those folders (``args.model == "sim"``, a default ``"builtin"``) fails here."""

import ast
from pathlib import Path

from worldstream.engine.core import registry

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("app", "streaming", "engine/core")


def _family_names() -> set[str]:
    """The shipped rows' names and ``--model`` names, less those that are also a world's name
    (``avatar``: a world, and the page kind ``BackendInfo.world``)."""
    rows = registry.FAMILIES.values()
    names = {f.name for f in rows} | {f.model for f in rows if f.model}
    return names - set(registry.WORLDS)


def _constants(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), str(path))
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)]


def test_the_shipped_families_are_known_here():
    # the check below means something only while the registry has the shipped rows
    assert {"builtin", "sim", "matrix-game-2", "game-sim"} <= _family_names()


def test_no_family_name_is_a_string_constant_in_the_core_folders():
    names = _family_names()
    found = [f"{path.relative_to(ROOT)}:{line}: {value!r}"
             for folder in FOLDERS for path in sorted((ROOT / folder).rglob("*.py"))
             for line, value in _constants(path) if value in names]
    assert found == []
