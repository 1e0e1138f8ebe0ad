"""The command server's pure parts: its messages checked both ways, which commands it serves,
and the rule that makes a forked child a fresh process: no module it preloads computes anything
at import from the environment, the terminal, the cwd, the clock or the process."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

import launcher
from launcher.entry.cmdserver import client, server, wire

PACKAGE = Path(launcher.__file__).resolve().parent


# -- messages ----------------------------------------------------------------------------------


STREAM = wire.Stream("utf-8", "strict", True, False)
MESSAGES: list[wire.Message] = [
    wire.Request(["launcher", "status"], "/tmp", {"A": "b", "\udcff": "x"}, 0o022, [STREAM] * 3),
    wire.Started(123),
    wire.Declined("host pve asks for its key's passphrase on the terminal"),
    wire.Go(),
    wire.Signal(2),
    wire.Exited(141),
]


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
def test_every_message_survives_the_wire(message: wire.Message) -> None:
    assert wire.decode(wire.encode(message)) == message


@pytest.mark.parametrize(
    "packet",
    [
        b"",
        b"not json",
        b"[]",
        b'{"type": "Nope"}',
        b'{"type": "Exited"}',  # a key missing
        b'{"type": "Exited", "code": 0, "extra": 1}',  # a key not declared
        b'{"type": "Exited", "code": "0"}',
        b'{"type": "Exited", "code": true}',  # a bool is no exit code
        b'{"type": "Signal", "signum": 2.0}',
        b'{"type": "Request", "argv": ["a", 1], "cwd": "/", "env": {}, "umask": 18, "streams": []}',
        b'{"type": "Request", "argv": [], "cwd": "/", "env": {"a": 1}, "umask": 18, "streams": []}',
        b'{"type": "Request", "argv": [], "cwd": "/", "env": {}, "umask": 18, "streams": []}',
        b'{"type": "Request", "argv": [], "cwd": "/", "env": {}, "umask": 18,'
        b' "streams": [["utf-8", "strict", 1, false], ["utf-8", "strict", true, false],'
        b' ["utf-8", "strict", true, false]]}',
    ],
)
def test_anything_else_is_refused(packet: bytes) -> None:
    with pytest.raises(wire.WireError):
        wire.decode(packet)


# -- which commands ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "command"),
    [
        (["status"], "status"),
        (["-i", "inv.yaml", "-t", "a,b", "--debug", "deploy", "--restart"], "deploy"),
        (["--known-hosts", "kh", "-q", "logs", "-f"], "logs"),
        (["--inventory", "status", "verify"], "verify"),  # `status` is -i's value here
        (["--version"], None),
        ([], None),
        (["--", "stop"], "stop"),
    ],
)
def test_the_command_is_the_first_word_no_global_option_takes(
    argv: list[str], command: str | None
) -> None:
    assert wire.command_of(argv) == command


def test_what_is_served_and_what_never_is() -> None:
    assert {"status", "logs", "verify", "deploy", "stop", "history", "rollback"} <= wire.SERVED
    never = {"attach", "watch", "job", "sandbox", "inventory", "disconnect", "completion"}
    assert not never & wire.SERVED


@pytest.mark.parametrize(
    ("value", "seconds"),
    [(None, 0.0), ("0", 0.0), ("60", 60.0), ("2.5", 2.5), ("-1", 0.0), ("nan", 0.0), ("x", 0.0)],
)
def test_the_server_lives_as_long_as_a_persisted_connection(
    value: str | None, seconds: float
) -> None:
    env = {} if value is None else {wire.ENV: value}
    assert wire.idle_seconds(env) == seconds


@pytest.mark.parametrize(
    ("args", "found"),
    [
        (["status"], None),
        (["-i", "a.yaml", "status"], "a.yaml"),
        (["status", "--inventory", "b.yaml"], "b.yaml"),
        (["--inventory=c.yaml", "status", "-id.yaml"], "d.yaml"),
    ],
)
def test_the_inventory_a_child_looks_at_is_the_commands(args: list[str], found: str | None) -> None:
    assert server.inventory_option(args) == found


def test_nothing_is_handed_over_when_off_or_not_served(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(wire.ENV, "60")
    for argv in (["attach"], ["watch"], ["--help"], ["sandbox", "up"], []):
        assert client.hand_over(argv) == client.NoServer(start=False)
    for value in ("0", "off"):
        monkeypatch.setenv(wire.ENV, value)
        assert client.hand_over(["status"]) == client.NoServer(start=False)


def test_the_fingerprint_follows_the_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    before = wire.fingerprint()
    assert wire.fingerprint() == before
    monkeypatch.setenv("PYTHONWARNINGS", "error")
    assert wire.fingerprint() != before
    monkeypatch.delenv("PYTHONWARNINGS")
    monkeypatch.setattr(sys, "path", [*sys.path, "/nonexistent"])
    assert wire.fingerprint() != before


# -- a forked child is a fresh process ---------------------------------------------------------

# What would freeze in the server at import and be wrong in every child: the environment, the
# terminal and the standard streams, the cwd, the process, the clock, who and where.
READ = {"os.environ", "sys.stdin", "sys.stdout", "sys.stderr"}  # read at all
CALLED = {  # called (a reference, as a default clock, is fine)
    "os.getenv",
    "os.getcwd",
    "os.getpid",
    "os.get_terminal_size",
    "shutil.get_terminal_size",
    "Path.cwd",
    "Path.home",
    "time.time",
    "time.monotonic",
    "datetime.now",
    "getpass.getuser",
    "socket.gethostname",
    "isatty",
}


def named(node: ast.AST, names: set[str]) -> bool:
    text = ast.unparse(node)
    return any(text == name or text.endswith(f".{name}") for name in names)


def preloaded() -> list[Path]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        skipped = any(name == n or name.startswith(f"{n}.") for n in server.NOT_PRELOADED)
        if not skipped and parts[-1] != "__main__":
            found.append(path)
    return found


def at_import(tree: ast.Module) -> list[ast.AST]:
    """The nodes that run when the module is imported: not a function's body (its decorators
    and defaults do run), a class's body but not its methods' bodies."""
    found: list[ast.AST] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            if not isinstance(node, ast.Lambda):
                for decorator in node.decorator_list:
                    found.extend(ast.walk(decorator))
            found.extend(
                n for d in node.args.defaults + node.args.kw_defaults if d for n in ast.walk(d)
            )
            return
        found.append(node)
        for child in ast.iter_child_nodes(node):
            visit(child)

    for statement in tree.body:
        visit(statement)
    return found


def test_no_preloaded_module_computes_anything_at_import_from_the_process() -> None:
    offenders = []
    for path in preloaded():
        for node in at_import(ast.parse(path.read_text())):
            read = isinstance(node, ast.Attribute) and named(node, READ)
            called = isinstance(node, ast.Call) and named(node.func, CALLED)
            if read or called:
                offenders.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: {ast.unparse(node)}")
    assert offenders == []


def test_the_audit_sees_what_it_looks_for() -> None:
    tree = ast.parse(
        "import os, sys\n"
        "WIDTH = os.environ.get('COLUMNS')\n"
        "class A:\n    TTY = sys.stdout.isatty()\n    def f(self): return os.getcwd()\n"
        "def g(x=os.getpid()): return os.environ\n"
    )
    nodes = at_import(tree)
    read = {ast.unparse(n) for n in nodes if isinstance(n, ast.Attribute) and named(n, READ)}
    called = {
        ast.unparse(n.func) for n in nodes if isinstance(n, ast.Call) and named(n.func, CALLED)
    }
    assert read == {"os.environ", "sys.stdout"}
    assert called == {"sys.stdout.isatty", "os.getpid"}  # not os.getcwd: a method's body


def test_the_server_preloads_every_module_it_may_fork_for() -> None:
    names = {p.relative_to(PACKAGE).as_posix() for p in preloaded()}
    assert {"cli/main.py", "config/models.py", "probe/workflows.py", "deploy/deploy.py"} <= names
    assert "agent/main.py" not in names and "sandbox/manager.py" not in names
    assert os.path.basename(server.__file__) == "server.py"


def test_the_server_builds_every_model_a_child_would_build_again() -> None:
    """The configuration's models build on first use (defer_build); the server builds them all
    before it forks, so that no child spends ~30 ms building them for each command."""
    code = (
        "from launcher.entry.cmdserver import server; server.preload()\n"
        "from pydantic import BaseModel\n"
        "pending, unbuilt = [BaseModel], []\n"
        "while pending:\n"
        "    for m in pending.pop().__subclasses__():\n"
        "        pending.append(m)\n"
        "        if m.__module__.startswith('launcher.') and not m.__pydantic_complete__:\n"
        "            unbuilt.append(m.__qualname__)\n"
        "print(sorted(unbuilt))\n"
    )
    found = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert found.stdout.strip() == "[]", found.stdout + found.stderr
