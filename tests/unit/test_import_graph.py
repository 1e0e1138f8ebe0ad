"""No import cycle among launcher's modules: each layer can be read, tested and replaced on its
own only if it does not, through any chain, import what imports it.

Every import counts, a function's own (deferred) imports too; only those under
`if TYPE_CHECKING:` do not (they never run). `from launcher import x` is an edge to the module
`launcher.x` when there is one, else to the package (its __init__).
"""

from __future__ import annotations

import ast
from pathlib import Path

import launcher

PACKAGE = Path(launcher.__file__).resolve().parent


def module_files() -> dict[str, Path]:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def _type_only(tree: ast.Module) -> set[int]:
    """The ids of the nodes under an `if TYPE_CHECKING:`."""
    hidden: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                hidden.update(id(n) for n in ast.walk(child))
    return hidden


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    tree = ast.parse(path.read_text())
    hidden = _type_only(tree)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in hidden:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            names = [f"{module}.{alias.name}" for alias in node.names]
            found.update(names)
            if not all(n in modules for n in names):
                found.add(module)  # a name defined in the module itself
    return {m for m in found if m in modules and m != name}


def import_graph() -> dict[str, set[str]]:
    modules = module_files()
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle_among_launchers_modules() -> None:
    graph = import_graph()
    assert len(graph) > 50  # the walk found the package
    found = cycles(graph)
    described = [
        "; ".join(f"{m} -> {', '.join(sorted(graph[m] & set(c)))}" for m in c) for c in found
    ]
    assert found == [], "import cycles:\n" + "\n".join(described)


def test_the_cycle_finder_finds_cycles_and_ignores_type_only_imports(tmp_path: Path) -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    source = tmp_path / "m.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from launcher.transport.connection import Connection\n"
        "def f():\n"
        "    from launcher.transport import persist\n"
        "    from launcher.core import version\n"
        "    from launcher.transport.endpoint import Endpoint\n"
    )
    modules = module_files()
    got = imports_of("launcher.m", source, modules)
    assert got == {
        "launcher.transport.persist",
        "launcher.core.version",
        "launcher.transport.endpoint",
    }


def test_the_cli_handles_no_connection() -> None:
    """cli/ parses options and renders results; the workflows own their connections
    (fleet.run_one, fleet.on_target, fleet.connections_for, job.on_job)."""
    graph = import_graph()
    reached = {
        (module, dep)
        for module, deps in graph.items()
        if module.startswith("launcher.cli")
        for dep in deps
        if dep.startswith("launcher.transport")
    }
    assert reached == set()
