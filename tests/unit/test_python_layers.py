"""arrowstate's Python packages and modules import each other in layers, never in a circle:
every module's imports (at module level and inside functions, relative and absolute) read
with `ast`, as a graph whose nodes are the package root (its __init__), each top-level
module and each sub-package (a nested sub-package is part of its top-level one); and again
with every module a node. A cycle fails, naming its imports. An import inside a function
counts as any other, so deferring an import does not hide a cycle; so does one under `if
TYPE_CHECKING:`: it is never run, but a module that names another's type for its checker
depends on it as much as one that calls it.
"""
from __future__ import annotations

import ast
import pathlib

PYTHON = pathlib.Path(__file__).resolve().parents[2] / "python"


def _module(path: pathlib.Path, top: pathlib.Path) -> str:
    parts = list(path.relative_to(top.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(name: str, top: pathlib.Path) -> bool:
    where = top.parent.joinpath(*name.split("."))
    return where.with_suffix(".py").is_file() or (where / "__init__.py").is_file()


def _imports(path: pathlib.Path, top: pathlib.Path):
    """(module imported, line, inside a function) for each import of the package's own
    modules in `path`; `from X import name` imports X.name where that is a module."""
    module = _module(path, top)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]

    def visit(node, in_function):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno, in_function
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module
            for alias in node.names:
                target = f"{source}.{alias.name}"
                yield (target if _is_module(target, top) else source), node.lineno, in_function
        deeper = in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                  ast.Lambda))
        for child in ast.iter_child_nodes(node):
            yield from visit(child, deeper)

    for target, line, in_function in visit(ast.parse(path.read_text()), False):
        if target == top.name or target.startswith(top.name + "."):
            yield target, line, in_function


def _node(module: str) -> str:
    """The package root, a top-level module, or the top-level sub-package holding it."""
    return ".".join(module.split(".")[:2])


def import_graph(top: pathlib.Path, modules: bool = False) -> dict[tuple[str, str], list[str]]:
    """(node, node it imports) -> where: `file:line` of each import making that edge. With
    `modules`, every module is a node of its own (a package's is its __init__)."""
    edges: dict[tuple[str, str], list[str]] = {}
    for path in sorted(top.rglob("*.py")):
        module = _module(path, top)
        here = module if modules else _node(module)
        for target, line, in_function in _imports(path, top):
            there = target if modules else _node(target)
            # importing arrowstate.x.y runs its parents' __init__ first: that is Python's
            # order, not an import of theirs, so only the module named makes an edge
            where = f"{path.relative_to(top.parent)}:{line}" + (
                " (inside a function)" if in_function else "")
            if there != here and where not in edges.get((here, there), []):
                edges.setdefault((here, there), []).append(where)
    return edges


def cycles(edges) -> list[list[str]]:
    """One cycle through each group of nodes that import each other in circles (Tarjan's
    strongly connected components), as the node list it goes round, first node repeated."""
    graph: dict[str, list[str]] = {}
    for a, b in edges:
        graph.setdefault(a, []).append(b)
        graph.setdefault(b, [])
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[set[str]] = []

    def connect(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(group)

    for v in sorted(graph):
        if v not in index:
            connect(v)
    found = []
    for group in groups:   # a shortest way back to the group's first node
        start = min(group)
        paths = {start: [start]}
        frontier = [start]
        while frontier and start not in [w for v in frontier for w in graph[v]]:
            later = []
            for v in frontier:
                for w in sorted(graph[v]):
                    if w in group and w not in paths:
                        paths[w] = paths[v] + [w]
                        later.append(w)
            frontier = later
        last = next(v for v in frontier if start in graph[v])
        found.append(paths[last] + [start])
    return found


def describe(cycle: list[str], edges) -> str:
    """The cycle and its imports; then any other import within the same group of nodes."""
    shown = list(zip(cycle, cycle[1:]))
    rest = sorted(e for e in _within(cycle, edges) if e not in shown)
    return " -> ".join(cycle) + "".join(
        f"\n  {a} imports {b}: " + ", ".join(edges[a, b]) for a, b in shown) + "".join(
        f"\n  and {a} imports {b}: " + ", ".join(edges[a, b]) for a, b in rest)


def _within(cycle: list[str], edges) -> list[tuple[str, str]]:
    """The imports between nodes of the cycle's group (the nodes reachable both ways)."""
    def reach(start, forward):
        seen, todo = {start}, [start]
        while todo:
            v = todo.pop()
            for a, b in edges:
                w = b if forward and a == v else a if not forward and b == v else None
                if w is not None and w not in seen:
                    seen.add(w)
                    todo.append(w)
        return seen
    group = reach(cycle[0], True) & reach(cycle[0], False)
    return [(a, b) for a, b in edges if a in group and b in group]


def test_arrowstate_packages_import_in_layers():
    edges = import_graph(PYTHON / "arrowstate")
    assert ("arrowstate.worker", "arrowstate.store") in edges   # the graph is read
    found = cycles(edges)
    assert not found, "import cycles:\n" + "\n".join(describe(c, edges) for c in found)


def test_arrowstate_modules_import_in_layers():
    """Within a package too, no two modules import each other, at any depth."""
    edges = import_graph(PYTHON / "arrowstate", modules=True)
    found = cycles(edges)
    assert not found, "import cycles:\n" + "\n".join(describe(c, edges) for c in found)


def test_nothing_in_spark_state_imports_a_live_family():
    """Live families present their state through spark_state; the reverse would be a cycle
    (and would load pandas and pyspark's function machinery into the offline tools)."""
    edges = import_graph(PYTHON / "arrowstate")
    assert ("arrowstate.families", "arrowstate.spark_state") in edges
    assert ("arrowstate.spark_state", "arrowstate.families") not in edges


def _tree(root: pathlib.Path, files: dict[str, str]) -> pathlib.Path:
    for name, text in files.items():
        path = root / "pkg" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / "pkg"


def test_a_cycle_between_sub_packages_fails_naming_it(tmp_path):
    top = _tree(tmp_path, {
        "__init__.py": "",
        "low.py": "import os\n",
        "a/__init__.py": "from .one import X\n",
        "a/one.py": "from ..b.two import Y\nfrom .. import low\nX = 1\n",
        "b/__init__.py": "",
        "b/two.py": "import pkg.a.one\nY = 2\n",
    })
    edges = import_graph(top)
    assert edges[("pkg.a", "pkg.low")] == ["pkg/a/one.py:2"]
    assert cycles(edges) == [["pkg.a", "pkg.b", "pkg.a"]]
    assert describe(cycles(edges)[0], edges) == (
        "pkg.a -> pkg.b -> pkg.a\n  pkg.a imports pkg.b: pkg/a/one.py:1\n"
        "  pkg.b imports pkg.a: pkg/b/two.py:1")


def test_an_import_inside_a_function_that_closes_a_cycle_fails(tmp_path):
    top = _tree(tmp_path, {
        "__init__.py": "",
        "tools.py": "from .store import files\n",
        "store/__init__.py": "",
        "store/files.py": "def f():\n    from pkg.tools import g\n    return g\n",
    })
    edges = import_graph(top)
    assert cycles(edges) == [["pkg.store", "pkg.tools", "pkg.store"]]
    assert edges[("pkg.store", "pkg.tools")] == ["pkg/store/files.py:2 (inside a function)"]
    assert cycles(import_graph(top, modules=True)) == [
        ["pkg.store.files", "pkg.tools", "pkg.store.files"]]


def test_an_import_for_type_checkers_that_closes_a_cycle_fails(tmp_path):
    top = _tree(tmp_path, {
        "__init__.py": "",
        "a.py": "from typing import TYPE_CHECKING\nfrom . import b\n"
                "if TYPE_CHECKING:\n    from .c import C\n",
        "b.py": "import typing\nif typing.TYPE_CHECKING:\n    from . import a\n"
                "else:\n    from . import c\n",
        "c.py": "X = 1\n",
    })
    edges = import_graph(top)
    assert sorted(edges) == [("pkg.a", "pkg.b"), ("pkg.a", "pkg.c"), ("pkg.b", "pkg.a"),
                             ("pkg.b", "pkg.c")]
    assert edges[("pkg.b", "pkg.a")] == ["pkg/b.py:3"]
    assert cycles(edges) == [["pkg.a", "pkg.b", "pkg.a"]]


def test_imports_within_a_package_and_of_other_libraries_make_no_edge(tmp_path):
    top = _tree(tmp_path, {
        "__init__.py": "from .a import one\n",
        "a/__init__.py": "from . import one\nfrom .inner import deep\n",
        "a/one.py": "import json\nfrom pyarrow import compute\nfrom . import inner\n",
        "a/inner/__init__.py": "",
        "a/inner/deep.py": "import pkg.a.one\nfrom ...a import one\n",
    })
    edges = import_graph(top)
    assert edges == {("pkg", "pkg.a"): ["pkg/__init__.py:1"]}
    assert cycles(edges) == []
    assert cycles(import_graph(top, modules=True)) == []
    assert import_graph(top, modules=True)[("pkg.a.inner.deep", "pkg.a.one")] == [
        "pkg/a/inner/deep.py:1", "pkg/a/inner/deep.py:2"]


def test_an_import_of_the_package_root_that_closes_a_cycle_fails(tmp_path):
    top = _tree(tmp_path, {
        "__init__.py": "from .tools import run\nVERSION = 1\n",
        "tools.py": "def run():\n    from . import VERSION\n    return VERSION\n",
    })
    edges = import_graph(top)
    assert cycles(edges) == [["pkg", "pkg.tools", "pkg"]]
    assert edges[("pkg.tools", "pkg")] == ["pkg/tools.py:2 (inside a function)"]
