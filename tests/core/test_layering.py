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


def _module_graph() -> dict[str, set[str]]:
    """Product module -> the product modules it imports, at any depth of the file (a function's
    lazy import counts; an import under ``if TYPE_CHECKING:``, for annotations only, does
    not). ``from package import module`` counts as importing the module, not the package."""
    files = {}
    for top in ("app", "engine", "kernels", "streaming"):
        for path in (ROOT / top).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            files[name.removesuffix(".__init__")] = path

    def typing_only(node: ast.AST) -> bool:
        return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)

    graph = {}
    for name, path in files.items():
        found, todo = set(), [ast.parse(path.read_text())]
        while todo:
            node = todo.pop()
            for child in ast.iter_child_nodes(node):
                if not typing_only(child):
                    todo.append(child)
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                subs = [f"{node.module}.{a.name}" for a in node.names]
                whole = [s.removeprefix("worldstream.") for s in subs]
                targets = subs if all(s in files for s in whole) else [node.module]
            else:
                continue
            found |= {t.removeprefix("worldstream.") for t in targets} & files.keys()
        graph[name] = found - {name}
    return graph


def test_no_import_circles():
    # a circle means two modules that cannot be read (or changed) apart: each has one job and
    # its users import it, never the other way round
    graph = _module_graph()
    circles, seen = [], set()
    for start in sorted(graph):
        stack, path = [(start, iter(sorted(graph[start])))], [start]
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                stack.pop()
                path.pop()
            elif child == start:
                cycle = tuple(sorted(path))
                if cycle not in seen:
                    seen.add(cycle)
                    circles.append(" -> ".join([*path, start]))
            elif child not in path and child > start:
                stack.append((child, iter(sorted(graph[child]))))
                path.append(child)
    assert circles == []
