"""The package's imports run one way: no cycle anywhere, TYPE_CHECKING and function-level imports included.

Reference: the import graph read from the source with ``ast`` (every ``import`` / ``from ... import`` statement,
wherever it sits), and its strongly connected components found by a plain depth-first search.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"lit_fgrpo": ROOT / "lit_fgrpo", "lit_fgrpo.callbacks": ROOT / "callbacks"}


def module_files() -> dict[str, Path]:
    """``dotted name -> file`` of every module of the package (``callbacks/`` installed as ``lit_fgrpo.callbacks``)."""
    modules: dict[str, Path] = {}
    for package, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join([package, *parts])] = path
    return modules


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """``module -> the package modules it imports`` (``from pkg import mod`` counts as importing ``pkg.mod``)."""
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                if node.module in modules:
                    targets.add(node.module)
                targets.update(f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in modules)
            elif isinstance(node, ast.Import):
                targets.update(a.name for a in node.names if a.name in modules)
        graph[name] = targets - {name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_cycle_in_the_package() -> None:
    graph = import_graph(module_files())
    assert len(graph) > 100  # the whole package was read
    assert cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle_behind_type_checking() -> None:
    # the reference for the check above: a two-module cycle hidden behind TYPE_CHECKING is found, a chain is not
    assert cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []
    source = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from lit_fgrpo.x import y\n"
    imported = [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ImportFrom)]
    assert [n.module for n in imported] == ["typing", "lit_fgrpo.x"]


def test_nothing_below_the_commands_imports_them() -> None:
    # the commands (the CLI, its helpers, the experiment commands) sit on top: no library module imports them
    graph = import_graph(module_files())
    above = ("lit_fgrpo.commands", "lit_fgrpo.experiments", "lit_fgrpo.__main__", "lit_fgrpo.cli")
    offenders = sorted(
        f"{module} -> {target}"
        for module, targets in graph.items()
        if not module.startswith(above)
        for target in targets
        if target.startswith("lit_fgrpo.commands")
    )
    assert offenders == []
