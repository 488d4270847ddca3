"""``nvshim/runtime/`` modules import in one direction (issue 22, item 7): every import
between them, lazy ones and those for type checking included, forms no circle, so each
type and step has one home."""

from __future__ import annotations

import ast
import os

from tests.conftest import REPO

PACKAGE = os.path.join(REPO, "nvshim", "runtime")


def runtime_imports() -> dict[str, set[str]]:
    """Module -> the ``nvshim.runtime`` modules it imports anywhere in its text."""
    modules = {n[:-3] for n in os.listdir(PACKAGE) if n.endswith(".py") and n != "__init__.py"}
    graph = {}
    for name in modules:
        with open(os.path.join(PACKAGE, f"{name}.py"), encoding="utf-8") as fh:
            tree = ast.parse(fh.read())
        found = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                parts = node.module.split(".")
                if parts[:2] == ["nvshim", "runtime"] and len(parts) > 2:
                    found.add(parts[2])
                elif node.module == "nvshim.runtime":
                    found.update(a.name for a in node.names if a.name in modules)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    parts = alias.name.split(".")
                    if parts[:2] == ["nvshim", "runtime"] and len(parts) > 2:
                        found.add(parts[2])
        graph[name] = found - {name}
    return graph


def circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of ``graph`` (its modules in order), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(name: str, path: list[str]) -> list[str] | None:
        state[name] = 1
        for dep in sorted(graph.get(name, ())):
            if state.get(dep) == 1:
                return [*path[path.index(dep) :], dep]
            if dep not in state and (found := visit(dep, [*path, dep])):
                return found
        state[name] = 2
        return None

    for name in sorted(graph):
        if name not in state and (found := visit(name, [name])):
            return found
    return None


def test_the_runtime_modules_import_in_one_direction():
    graph = runtime_imports()
    assert {"create", "finish", "lowlevel", "main", "passthrough"} <= set(graph)
    assert circle(graph) is None, " -> ".join(circle(graph))


def test_the_circle_finder_finds_a_circle():
    assert circle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert circle({"a": {"b"}, "b": set()}) is None
