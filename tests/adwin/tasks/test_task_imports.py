"""The built-in task's modules import in one direction: no two of them import each other, even through
function-level imports (issue 13: ``assets`` and ``build`` did)."""

from __future__ import annotations

import ast
from pathlib import Path

import adwin.tasks

TASKS = Path(adwin.tasks.__file__).parent
PKG = "adwin.tasks"
SUBMODULES = {p.stem for p in TASKS.glob("*.py") if p.stem != "__init__"}


def _edges(path: Path) -> set[str]:
    """Sibling modules ``path`` imports (module level or inside functions)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + ([f"{PKG}.{a.name}" for a in node.names] if node.module == PKG else [])
        out |= {n.split(".")[2] for n in names if n.startswith(f"{PKG}.") and n.split(".")[2] in SUBMODULES}
    return out


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> list[str] | None:
        if node in path:
            return path[path.index(node):] + [node]
        if node in done:
            return None
        for nxt in sorted(graph[node]):
            if found := visit(nxt, path + [node]):
                return found
        done.add(node)
        return None

    return next((c for start in sorted(graph) if (c := visit(start, []))), None)


def test_cycle_finder_reports_a_planted_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_task_modules_do_not_import_each_other_in_a_cycle() -> None:
    graph = {m: _edges(TASKS / f"{m}.py") - {m} for m in SUBMODULES}
    assert graph["build"], "the import scan found no sibling imports: it no longer reads the modules"
    assert _cycle(graph) is None, f"import cycle among adwin/tasks modules: {' -> '.join(_cycle(graph) or [])}"
