#!/usr/bin/env python3
"""nvshim's import contract: the layers below, from the top down, and the check that holds
them. Every import between nvshim's modules, lazy ones (inside a function) and those for
type checking included, must

- go to the same layer or one below (never back up a layer), and
- form no circle (module by module, within a layer too).

A name below covers that module and, for a package, every module in it; the longest name
that matches wins (``nvshim.hook.main`` sits above the rest of ``nvshim.hook``). The top
package ``nvshim`` covers only its own ``__init__``. A module no layer names fails the
check: a new module is placed on purpose.

Run: ``python3 .ci/imports.py`` (exit 0: kept; 1: one line per breach). Standard library
only; ``.ci/run`` runs it before the tests, ``tests/test_imports.py`` runs it as a test.
"""

from __future__ import annotations

import ast
import os
import sys

# From the top down: (layer, the modules and packages in it).
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("commands", ("nvshim.__main__", "nvshim.entry", "nvshim.cli")),
    (
        "deployment and checks",
        (
            "nvshim.node",
            "nvshim.dra",
            "nvshim.doctor",
            "nvshim.engines",
            "nvshim.exporter",
            "nvshim.install",
            "nvshim.hostbundle",
            "nvshim.launch",
        ),
    ),
    ("nvshim-runtimed", ("nvshim.runtimed",)),
    ("nvshim-runtime", ("nvshim.runtime",)),
    ("nvshim-hook, the program", ("nvshim.hook.main",)),
    (
        "policy and the CDI sink",
        (
            "nvshim.policy",
            "nvshim.mps",
            "nvshim.pairing",
            "nvshim.cdi.generate",
            "nvshim.cdi.refresh",
            "nvshim.cdi.writer",
            "nvshim.console",
        ),
    ),
    ("nvshim-hook's steps", ("nvshim.hook",)),
    ("OCI spec edits", ("nvshim.oci",)),
    ("host discovery", ("nvshim.host",)),
    (
        "config, container edits, CDI formats, the writer/hook contract",
        ("nvshim.config", "nvshim.edits", "nvshim.cdi", "nvshim.hookentries"),
    ),
    ("in-container file-system toolkit", ("nvshim.rootfs",)),
    (
        "base",
        (
            "nvshim",
            "nvshim.defaults",
            "nvshim.envbool",
            "nvshim.errors",
            "nvshim.fastjson",
            "nvshim.filecache",
            "nvshim.fsutil",
            "nvshim.ldcache",
            "nvshim.log",
            "nvshim.memo",
            "nvshim.options",
            "nvshim.record",
            "nvshim.trusted",
        ),
    ),
]

# (importer, imported): why this import up a layer stays. Each must still occur.
EXCEPTIONS: dict[tuple[str, str], str] = {
    ("nvshim.runtime.daemon", "nvshim.runtimed.main"): (
        "the old module name of nvshim-runtimed, kept for one upgrade: a launcher an older"
        " `nvshim install` wrote into a bin directory (no bundle) names it, and a restart"
        " of nvshim-runtimed.service before `nvshim install` rewrites it must still start;"
        " nothing in nvshim imports it"
    ),
}

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def modules(root: str) -> dict[str, str]:
    """Dotted name -> file of every module in the package at ``root``."""
    found = {}
    top = os.path.dirname(root)
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith((".", "__pycache__")))
        for name in files:
            if name.endswith(".py"):
                parts = os.path.relpath(os.path.join(folder, name[:-3]), top).split(os.sep)
                if parts[-1] == "__init__":
                    parts.pop()
                found[".".join(parts)] = os.path.join(folder, name)
    return found


def imports(name: str, path: str, known: dict[str, str]) -> dict[str, int]:
    """The modules of ``known`` that module ``name`` imports anywhere, with a line each.
    ``from P import N`` counts as an import of ``P.N`` when that is a module, else of
    ``P``."""
    with open(path, encoding="utf-8") as fh:
        tree = ast.parse(fh.read(), path)
    package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    found: dict[str, int] = {}

    def add(target: str, line: int) -> None:
        if target in known and target != name:
            found.setdefault(target, line)

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            for alias in node.names:
                full = f"{source}.{alias.name}"
                add(full if full in known else source, node.lineno)
    return found


def layer_of(name: str) -> int | None:
    """The index (0: top) of the layer that covers module ``name``, or None."""
    best, best_len = None, -1
    for index, (_, members) in enumerate(LAYERS):
        for member in members:
            covers = name == member or (member != "nvshim" and name.startswith(member + "."))
            if covers and len(member) > best_len:
                best, best_len = index, len(member)
    return best


def circles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Each strongly connected group of more than one module (Tarjan), as one circle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:  # recursion depth: the longest import chain
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for dep in sorted(graph.get(node, ())):
            if dep not in index:
                visit(dep)
                low[node] = min(low[node], low[dep])
            elif dep in on_stack:
                low[node] = min(low[node], index[dep])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(_circle(sorted(group), graph))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return groups


def _circle(group: list[str], graph: dict[str, dict[str, int]]) -> list[str]:
    """One circle through the first module of a strongly connected ``group``."""
    members, start = set(group), group[0]
    paths = {start: [start]}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for dep in sorted(graph.get(node, ())):
            if dep == start:
                return [*paths[node], start]
            if dep in members and dep not in paths:
                paths[dep] = [*paths[node], dep]
                queue.append(dep)
    return group


def check(root: str) -> tuple[list[str], str]:
    """The breaches of the contract in the package at ``root`` (one line each), and a
    summary line."""
    known = modules(root)
    graph = {name: imports(name, path, known) for name, path in sorted(known.items())}
    problems, used = [], set()
    for name in sorted(known):
        if layer_of(name) is None:
            problems.append(f"{name}: in no layer (add it to LAYERS in .ci/imports.py)")
    for name, deps in sorted(graph.items()):
        mine = layer_of(name)
        for dep, line in sorted(deps.items()):
            theirs = layer_of(dep)
            if mine is None or theirs is None or theirs >= mine:
                continue
            if (name, dep) in EXCEPTIONS:
                used.add((name, dep))
                continue
            where = os.path.relpath(known[name], os.path.dirname(root))
            problems.append(
                f"{where}:{line}: {name} ({LAYERS[mine][0]})"
                f" imports {dep} ({LAYERS[theirs][0]}), a layer above"
            )
    for pair in sorted(set(EXCEPTIONS) - used):
        problems.append(f"exception {pair[0]} -> {pair[1]}: no longer occurs, remove it")
    for circle in circles(graph):
        problems.append("import circle: " + " -> ".join(circle))
    edges = sum(len(deps) for deps in graph.values())
    summary = (
        f"imports: {len(known)} modules, {edges} imports, {len(LAYERS)} layers:"
        f" {len(circles(graph))} circles, {len(problems)} problems,"
        f" {len(used)} named exception(s)"
    )
    return problems, summary


def main(argv: list[str]) -> int:
    root = argv[0] if argv else os.path.join(REPO, "nvshim")
    problems, summary = check(root)
    for line in problems:
        print(line, file=sys.stderr)
    print(summary)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
