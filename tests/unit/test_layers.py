"""launcher's packages stand on each other in one order, bottom-up as the data flows: the pure
pieces (errors, output, the agent and its protocol, the judging), then configuration, the
connection, the container, targets, the workflows, and last the surfaces (commands, CLI, API,
Fabric tasks, the console). A module imports only from its own floor or the floors below it.

Every import counts: a function's own (deferred) imports and those under `if TYPE_CHECKING:`
too (a type-only import upward still ties the lower floor to the upper one for a reader and
for mypy). `from launcher import x` is an edge to the module `launcher.x` when there is one,
else to the package (its __init__). Modules load one another by name (`import_module`) only in
the console's entry points, where the name comes from the command line.
"""

from __future__ import annotations

import ast
from pathlib import Path

import launcher

PACKAGE = Path(launcher.__file__).resolve().parent

# Bottom-up. A floor is one or more top-level packages or modules of launcher ("launcher" is the
# package's own __init__: the public API's re-export).
FLOORS: tuple[tuple[str, ...], ...] = (
    ("core",),  # errors, exit codes, bounded reads, the version, the run id, requests
    ("output",),  # terminal lines, text made safe to print, the JSON envelope
    ("agent",),  # the in-container agent and its protocol: standard library only
    ("verify",),  # pane text to samples to verdicts: pure
    ("config",),  # inventory, playbook, ssh_config: validated once, errors with file and line
    ("transport",),  # SSH: connections, persistence, the relay, key and host-key files
    ("container",),  # pct verbs and the agent's client over one host connection
    ("targets",),  # one workflow's context, many targets at once, cluster placement
    ("deploy",),  # the deploy transaction, releases, projects, doctor, init
    ("probe",),  # verify, status, smoke: polls, the prober, reports
    ("operate",),  # logs, stop, attach, history, rollback, redeploy
    ("jobs",),  # multi-node jobs: nodes, network, all-or-nothing phases
    ("watch",),  # the long-running watcher of a target or a job
    ("buckets", "sandbox", "schemas"),  # side tools: bucket planning, the sandbox, JSON schemas
    ("commands",),  # each command declared once: its request, options and run function
    ("cli",),  # click commands rendering results
    ("api", "apijobs", "launcher"),  # the Python API
    ("tasks",),  # Fabric tasks
    ("entry", "__main__"),  # the console script, the command server, docs and demo tools
)
MAX_TOP_LEVEL = 20
# Imports that go up a floor, each with why; at most one, and only a type-only one.
UPWARD_ALLOWED: frozenset[str] = frozenset(
    {
        # `launcher disconnect` ends the command servers too (being resolved: the command
        # server's future is decided by its measurement).
        "launcher.operate.disconnect (floor 10) imports launcher.entry.cmdserver.client (floor 18)",
    }
)
# Where a module may load another by name: the console's entry points.
IMPORTS_BY_NAME = frozenset(
    {
        "launcher.entry.cmdserver.server",
        # being replaced by a table of functions:
        "launcher.cli.main",
        "launcher.commands.table",
    }
)


def module_files() -> dict[str, Path]:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Every launcher module `name` imports, wherever the import statement is."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
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


def room(module: str) -> str:
    """The top-level package or module of launcher that `module` belongs to."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "launcher"


def floor(module: str) -> int:
    for number, rooms in enumerate(FLOORS):
        if room(module) in rooms:
            return number
    raise AssertionError(f"{module}: its package {room(module)!r} is on no floor (FLOORS)")


def upward(graph: dict[str, set[str]]) -> list[str]:
    return sorted(
        f"{module} (floor {floor(module)}) imports {dep} (floor {floor(dep)})"
        for module, deps in graph.items()
        for dep in deps
        if floor(dep) > floor(module)
    )


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


def test_every_import_goes_down_the_floors() -> None:
    graph = import_graph()
    assert len(graph) > 100  # the walk found the package
    assert set(upward(graph)) <= UPWARD_ALLOWED, "\n".join(upward(graph))


def test_no_import_cycle_among_launchers_modules() -> None:
    graph = import_graph()
    found = cycles(graph)
    described = [
        "; ".join(f"{m} -> {', '.join(sorted(graph[m] & set(c)))}" for m in c) for c in found
    ]
    assert found == [], "import cycles:\n" + "\n".join(described)


def test_modules_load_each_other_by_name_only_in_the_entry_points() -> None:
    by_name = set()
    for name, path in module_files().items():
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and "import_module" in ast.unparse(node.func):
                by_name.add(name)
            if isinstance(node, ast.Call) and ast.unparse(node.func) == "__import__":
                by_name.add(name)
    assert by_name <= IMPORTS_BY_NAME


def test_the_top_level_holds_few_modules() -> None:
    modules = [p.name for p in PACKAGE.glob("*.py")]
    assert len(modules) <= MAX_TOP_LEVEL, sorted(modules)
    top = modules + [p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()]
    floored = {r for rooms in FLOORS for r in rooms}
    for name in top:
        stem = name.removesuffix(".py")
        assert stem in floored or stem == "__init__", f"launcher/{name} is on no floor"


def test_the_checks_find_what_they_look_for(tmp_path: Path) -> None:
    """The finders themselves: a cycle, an upward import under TYPE_CHECKING and in a function."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    source = tmp_path / "m.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from launcher.cli.main import cli\n"
        "def f():\n"
        "    from launcher.transport import persist\n"
        "    from launcher.core import version\n"
    )
    got = imports_of("launcher.config.m", source, module_files())
    assert got == {"launcher.cli.main", "launcher.transport.persist", "launcher.core.version"}
    assert upward({"launcher.config.m": got}) == [
        "launcher.config.m (floor 4) imports launcher.cli.main (floor 15)",
        "launcher.config.m (floor 4) imports launcher.transport.persist (floor 5)",
    ]
