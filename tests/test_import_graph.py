"""The package's imports run one way: a folder order, and no cycle anywhere.

Reference: the import graph read from the source with ``ast`` (every ``import`` / ``from ... import`` statement,
wherever it sits: module level, inside functions, behind ``TYPE_CHECKING``, in package ``__init__`` files; and
``importlib.import_module("lit_fgrpo...")`` with a literal name), its strongly connected components found by a plain
depth-first search, and each edge held against :data:`LAYERS`.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"lit_fgrpo": ROOT / "lit_fgrpo", "lit_fgrpo.callbacks": ROOT / "callbacks"}

LAYERS: tuple[tuple[str, ...], ...] = (
    ("errors",),
    ("settings_mapping",),
    ("objectives", "theory"),
    ("metrics",),
    ("reporting", "distributed"),
    ("models",),
    ("tasks",),
    ("rewards",),
    ("environments",),
    ("data",),
    ("engines",),
    ("servers",),
    ("rollout",),
    ("training",),
    ("callbacks",),
    ("commands",),
    ("experiments",),
    ("cli", "lit_fgrpo"),
)
"""The folders (and top-level modules) from the bottom up, as ``docs/architecture.md`` draws them.

A module may import its own folder and any folder of a lower layer; never a higher layer, nor another folder of its
own layer. ``cli`` (with ``__main__``) is the entry point (it dispatches to commands and experiments by name) and
``lit_fgrpo`` is the package's facade (``lit_fgrpo/__init__.py``), whose module-level imports every import runs, so
those must stay at the bottom (:func:`test_the_facade_imports_only_the_pure_bottom_eagerly`)."""

RANK = {unit: rank for rank, units in enumerate(LAYERS) for unit in units}


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


def imported_names(node: ast.AST, modules: dict[str, Path]) -> set[str]:
    """The package modules one ``import`` node (or a literal ``importlib.import_module`` call) names."""
    targets: set[str] = set()
    if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
        if node.module in modules:
            targets.add(node.module)
        targets.update(f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in modules)
    elif isinstance(node, ast.Import):
        targets.update(a.name for a in node.names if a.name in modules)
    elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        if name == "import_module" and node.args[0].value in modules:
            targets.add(str(node.args[0].value))
    return targets


def import_edges(modules: dict[str, Path]) -> dict[str, dict[str, int]]:
    """``module -> {imported package module: line of the first import}``, every import wherever it sits."""
    edges: dict[str, dict[str, int]] = {}
    for name, path in modules.items():
        found: dict[str, int] = {}
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            for target in imported_names(node, modules):
                if target != name:
                    found.setdefault(target, getattr(node, "lineno", 0))
        edges[name] = found
    return edges


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """``module -> the package modules it imports`` (``from pkg import mod`` counts as importing ``pkg.mod``)."""
    return {name: set(targets) for name, targets in import_edges(modules).items()}


def unit_of(module: str) -> str:
    """The folder (or top-level module) a dotted module name belongs to: ``lit_fgrpo.rollout.source -> rollout``."""
    parts = module.split(".")
    unit = parts[1] if len(parts) > 1 else parts[0]
    return "cli" if unit == "__main__" else unit


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan's algorithm, iterative)."""
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
                    work.append((child, iter(sorted(graph.get(child, ())))))
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


def folder_graph(edges: dict[str, dict[str, int]]) -> dict[str, set[str]]:
    """``folder -> the other folders it imports``, every edge of :func:`import_edges` counted by folder."""
    graph: dict[str, set[str]] = {}
    for module, targets in edges.items():
        graph.setdefault(unit_of(module), set()).update(unit_of(t) for t in targets if unit_of(t) != unit_of(module))
    return graph


def against_the_order(edges: dict[str, dict[str, int]], modules: dict[str, Path]) -> list[str]:
    """Every import whose target folder is not strictly below its own (``file:line: a -> b``)."""
    offenders = []
    for module, targets in sorted(edges.items()):
        source = unit_of(module)
        for target, line in sorted(targets.items()):
            if unit_of(target) != source and RANK[unit_of(target)] >= RANK[source]:
                where = modules[module].relative_to(ROOT)
                offenders.append(f"{where}:{line}: {source} -> {unit_of(target)} ({target})")
    return offenders


def test_no_import_cycle_in_the_package() -> None:
    graph = import_graph(module_files())
    assert len(graph) > 100  # the whole package was read
    assert cycles(graph) == []


def test_every_folder_has_a_layer() -> None:
    assert {unit_of(m) for m in module_files()} <= set(RANK)


def test_imports_run_down_the_folder_order() -> None:
    modules = module_files()
    edges = import_edges(modules)
    assert against_the_order(edges, modules) == []
    assert cycles(folder_graph(edges)) == []


def test_the_facade_imports_only_the_pure_bottom_eagerly() -> None:
    # importing any module runs lit_fgrpo/__init__.py first: its module-level imports must not climb the layers
    modules = module_files()
    tree = ast.parse(modules["lit_fgrpo"].read_text())
    eager = {t for node in tree.body for t in imported_names(node, modules)}
    assert eager and max(RANK[unit_of(t)] for t in eager) <= RANK["metrics"]


def test_the_order_check_finds_an_upward_import(tmp_path: Path) -> None:
    # the reference for the checks above: an upward import (function-level, behind TYPE_CHECKING, or in a package
    # __init__) is named with its file and line, a downward one is not; a two-folder loop is a folder cycle
    source = (
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from lit_fgrpo.training.module import M\n"
        "def f():\n    import lit_fgrpo.rollout.source\n    from lit_fgrpo.objectives import advantages\n"
    )
    (tmp_path / "__init__.py").write_text(source)
    modules = {
        "lit_fgrpo.data": tmp_path / "__init__.py",
        "lit_fgrpo.training.module": tmp_path / "__init__.py",
        "lit_fgrpo.rollout.source": tmp_path / "__init__.py",
        "lit_fgrpo.objectives": tmp_path / "__init__.py",
        "lit_fgrpo.objectives.advantages": tmp_path / "__init__.py",
    }
    edges = {"lit_fgrpo.data": import_edges(modules)["lit_fgrpo.data"]}
    assert set(edges["lit_fgrpo.data"]) == {
        "lit_fgrpo.training.module",
        "lit_fgrpo.rollout.source",
        "lit_fgrpo.objectives",
        "lit_fgrpo.objectives.advantages",
    }
    offenders = against_the_order(edges, {"lit_fgrpo.data": ROOT / "lit_fgrpo" / "data" / "__init__.py"})
    assert [o.split(": ", 1)[1].split(" (")[0] for o in offenders] == ["data -> rollout", "data -> training"]
    assert offenders[0].startswith("lit_fgrpo/data/__init__.py:5:")
    assert cycles(
        folder_graph({"lit_fgrpo.data.x": {"lit_fgrpo.tasks.y": 1}, "lit_fgrpo.tasks.y": {"lit_fgrpo.data.z": 1}})
    ) == [["data", "tasks"]]
    assert cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


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
