"""The package layers (issue 13): bench -> app -> streaming -> engine -> kernels, no import
running upward; inside engine, the serving core (engine/core, engine/cluster) never imports a
model family, the procedural world, training or evaluation (backends are named by string in
``engine.core.registry`` and imported on demand)."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return {n.removeprefix("worldstream.") for n in names if n.startswith("worldstream.")}


def _offenders(folders: list[str], forbidden: tuple[str, ...]) -> list[str]:
    found = []
    for folder in folders:
        for path in sorted((ROOT / folder).rglob("*.py")):
            for name in _imports(path):
                if name.startswith(forbidden):
                    found.append(f"{path.relative_to(ROOT)} imports {name}")
    return found


@pytest.mark.parametrize("folder, forbidden", [
    ("kernels", ("engine", "streaming", "app", "bench")),
    ("engine", ("streaming", "app", "bench")),
    ("streaming", ("app", "bench")),
    ("app", ("bench",)),
])
def test_no_import_runs_upward(folder, forbidden):
    assert _offenders([folder], forbidden) == []


def test_serving_core_imports_no_model_world_or_training():
    forbidden = ("engine.backends", "engine.models", "engine.worlds", "engine.training",
                 "engine.evaluation")
    assert _offenders(["engine/core", "engine/cluster"], forbidden) == []


def test_procedural_world_imports_no_model_or_serving_code():
    # the world (simulator, scenes, actions, recorder) is data and rules: training, evaluation
    # and the backends build on it, not the other way round
    forbidden = ("engine.backends", "engine.models", "engine.training", "engine.evaluation",
                 "engine.cluster")
    assert _offenders(["engine/worlds"], forbidden) == []
