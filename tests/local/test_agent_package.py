"""The agent as a package shipped as one bundle: every module is in it, in an order in which each
imports only what came before (the loader runs them in that order, inside the container, with no
import system to find anything else), and the loader sent is the loader written."""

from __future__ import annotations

import ast
import base64
import subprocess
import sys
import zlib
from pathlib import Path

from launcher.agent import MODULES
from launcher.agent.protocol import AGENT_ARGV
from launcher.container.agentclient import agent_sources, boot_source, boot_wire, payload

PACKAGE = Path(__file__).resolve().parents[2] / "launcher" / "agent"


def launcher_imports(source: str) -> set[str]:
    """The launcher modules a source imports at its top level (TYPE_CHECKING imports aside)."""
    found = set()
    for node in ast.parse(source).body:
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("launcher"):
            assert node.level == 0 and node.module
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("launcher"))
    return found


def test_every_module_of_the_package_is_in_the_bundle() -> None:
    on_disk = {path.stem for path in PACKAGE.glob("*.py")} - {"__init__", "boot", "protocol"}
    assert set(MODULES) == on_disk
    assert len(MODULES) == len(set(MODULES))
    names = [name for name, _ in agent_sources()]
    assert names == ["launcher.agent.protocol", *(f"launcher.agent.{m}" for m in MODULES)]


def test_each_module_imports_only_what_runs_before_it() -> None:
    done: set[str] = set()
    for name, source in agent_sources():
        assert launcher_imports(source) <= done, name
        done.add(name)


def container_nodes(tree: ast.AST) -> list[ast.AST]:
    """The nodes that can run in the container: protocol.py's client-only branch (taken where
    the loader did not mark the module `__launcher_bundled__`) left out."""
    nodes: list[ast.AST] = []
    todo = [tree]
    while todo:
        node = todo.pop()
        nodes.append(node)
        if isinstance(node, ast.If) and "__launcher_bundled__" in ast.unparse(node.test):
            todo.extend(node.orelse)
        else:
            todo.extend(ast.iter_child_nodes(node))
    return nodes


def test_the_agent_imports_nothing_but_the_standard_library() -> None:
    client_only = 0
    for name, source in agent_sources():
        tree = ast.parse(source)
        client_only += len(list(ast.walk(tree))) - len(container_nodes(tree))
        for node in container_nodes(tree):
            if isinstance(node, ast.Import):
                tops = {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                tops = {node.module.split(".")[0]}
            else:
                continue
            allowed = sys.stdlib_module_names | {"launcher", "__future__"}
            assert tops <= allowed, (name, tops)
    assert 0 < client_only < 100  # the typing imports, and nothing much else


def test_the_loader_sent_is_the_loader_written() -> None:
    """Comments and blank lines dropped and indents shortened change no code."""
    written = (PACKAGE / "boot.py").read_text()
    assert ast.dump(ast.parse(boot_source())) == ast.dump(ast.parse(written))
    # It travels on every call, compressed: what BOOT decompresses is that very source.
    assert zlib.decompress(base64.b64decode(boot_wire())).decode() == boot_source()
    assert len(boot_wire()) < 1600


def test_the_agent_in_the_container_does_not_import_typing(tmp_path: Path) -> None:
    """The loader marks the modules it makes, so protocol.py's types cost no typing import on
    each call's start (~10 ms)."""
    request = {"op": "history", "workdir": str(tmp_path)}
    result = subprocess.run(
        ["python3", "-X", "importtime", *AGENT_ARGV[1:]],
        input=payload(request),
        capture_output=True,
        timeout=30,
        check=True,
    )
    assert b'"ok": true' in result.stdout
    imported = {line.rsplit("|", 1)[-1].strip() for line in result.stderr.decode().splitlines()}
    assert "typing" not in imported and "launcher" not in imported
