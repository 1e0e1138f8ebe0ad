"""Every command has the one shape of launcher.targets.workflow: a frozen Request, a typed Result
(exit code, summary, JSON form) and one run function in the command table; and the CLI,
`api.Launcher` and the Fabric tasks all reach that same run function with the same request."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import typing
from pathlib import Path
from typing import Any

import pytest
from invoke.exceptions import Exit

from launcher import tasks
from launcher.api import Launcher
from launcher.cli.main import cli, main
from launcher.commands import table as commands
from launcher.commands.table import BY_REQUEST, COMMANDS, Wiring, wiring, workflow_for
from launcher.core.declare import parameters
from launcher.core.errors import ExitCode, RefusedError
from launcher.targets.workflow import Context
from launcher.transport.pool import ConnectionPool
from tests.unit.projectfiles import write_project
from tests.unit.test_layers import module_files

# Commands of the CLI that are not one request run on targets, and why.
NOT_WORKFLOWS = {
    "attach": "replaces the process with the system ssh client (os.execvp) after one poll",
    "buckets": "local: plans sequence buckets, no target",
    "completion": "local: prints a shell's completion script",
    "disconnect": "local: ends persisted connections, no target",
    "inventory": "local: checks the inventory file",
    "init": "writes an inventory and a playbook from answers (a host key fetched, a trial run "
    "through fleet.on_target), then runs the doctor workflow",
    "job": "a group: its commands are the table's `job <name>`, each one run over the "
    "inventory's job (launcher.commands.jobs), which the CLI and api.Launcher.jobs both call",
    "sandbox": "local: the staging host itself",
    "status-format": "local: reads a sample of a trainer's lines (detect -t reads a pane "
    "through the logs workflow)",
    "watch": "long-running: one WatchSession (launcher.watch.session), which the CLI and "
    "api.Launcher.watch both run",
}
# What opens or hands out connections: the workflows' layers use these, the CLI does not.
CONNECTION_HANDLING = {"connections_for", "ConnectionPool", "Connection", "SSHConnection", "place"}
# The commands run on targets (a Context each), as the CLI names them.
ON_TARGETS = sorted(name for name, c in COMMANDS.items() if c.on != "inventory")


def test_every_cli_command_is_a_workflow_or_says_why_not() -> None:
    for name in cli.commands:
        assert (name in COMMANDS) != (name in NOT_WORKFLOWS), name
    for name in COMMANDS:
        assert name.partition(" ")[0] in cli.commands, name
    for name, why in NOT_WORKFLOWS.items():
        assert name in cli.commands and why.strip()


def test_runs_overloads_follow_the_workflows() -> None:
    """`commands.run` has one overload per request type run on targets (and in `Request`),
    each returning what that request's workflow returns: kept by hand, checked here."""
    overloads = {}
    # Read from the source: typing.get_overloads is Python 3.11+, and the client runs on 3.10.
    for node in ast.parse(Path(inspect.getfile(commands)).read_text()).body:
        if isinstance(node, ast.FunctionDef) and node.name == "run" and _is_overload(node):
            request = next(arg for arg in node.args.args if arg.arg == "request")
            assert request.annotation is not None and node.returns is not None
            overloads[ast.unparse(request.annotation)] = ast.unparse(node.returns)
    types = [COMMANDS[name].request_type for name in ON_TARGETS]
    wanted = {
        request_type.__name__: typing.get_type_hints(workflow_for(request_type))["return"].__name__
        for request_type in types
    }
    assert overloads == wanted
    assert set(typing.get_args(commands.Request)) == set(types)


def _is_overload(node: ast.FunctionDef) -> bool:
    return any(isinstance(d, ast.Name) and d.id == "overload" for d in node.decorator_list)


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_a_frozen_request_a_run_and_a_typed_result(name: str) -> None:
    command = COMMANDS[name]
    named = [p for p in parameters(command.request_type) if p.option.argument]
    request = command.request({p.keyword: "train" for p in named if not p.option.repeat})
    assert type(request) is command.request_type
    params = dataclasses.fields(request)  # a dataclass ...
    with pytest.raises(dataclasses.FrozenInstanceError):  # ... and frozen
        setattr(request, params[0].name if params else "anything", None)
    run = command.workflow
    assert run is workflow_for(command.request_type)
    hints = typing.get_type_hints(run)
    if command.on == "inventory":  # over the inventory, not a target's context
        assert list(inspect.signature(run).parameters)[:2] == ["inventory", "request"]
    else:
        assert list(inspect.signature(run).parameters)[:2] == ["ctx", "request"]
        assert hints["ctx"] is Context
    assert isinstance(request, hints["request"])
    result = hints["return"]
    result = typing.get_args(result)[0] if typing.get_args(result) else result  # list[JobResult]
    fields = {f.name for f in dataclasses.fields(result)}
    # A job's results (history, watch) need not be one target's shape: an exit code at least.
    wanted = ("exit_code",) if command.on == "inventory" else ("exit_code", "summary")
    for attribute in wanted:
        assert attribute in fields or isinstance(getattr(result, attribute, None), property), (
            f"{result.__name__} has no {attribute}"
        )
    if command.on != "inventory":
        assert callable(getattr(result, "to_json", None)), f"{result.__name__} has no to_json()"
    row = wiring(command).row
    assert (row is not None) == command.fleet, name
    assert row is None or callable(row), name


def _loaded_with(name: str) -> set[str]:
    """launcher's modules that importing `name` runs: its module-level imports, transitively
    (function-level and type-only ones do not run at import)."""
    modules = module_files()
    seen: set[str] = set()
    todo = [name]
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        path = modules[current]
        package = current if path.name == "__init__.py" else current.rpartition(".")[0]
        parents = [package.rsplit(".", i)[0] for i in range(package.count(".") + 1)]
        for node in ast.parse(path.read_text()).body:
            found: list[str] = []
            if isinstance(node, ast.Import):
                found = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                found = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            todo += [m for m in [*found, *parents] if m in modules]
    return seen


def test_the_cli_handles_no_connection() -> None:
    """Every connection is opened, shared and closed below the CLI (fleet, workflows, the watch
    session): no module of launcher/cli imports the transport or a connection helper."""
    found = []
    for name, path in module_files().items():
        if not name.startswith("launcher.cli."):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                names = {alias.name for alias in node.names}
                if node.module.startswith("launcher.transport") or names & CONNECTION_HANDLING:
                    found.append(f"{name}: from {node.module} import {', '.join(sorted(names))}")
            elif isinstance(node, ast.Import):
                found += [f"{name}: import {a.name}" for a in node.names if "transport" in a.name]
    assert found == []


def test_naming_a_request_loads_no_workflow() -> None:
    """The table loads run functions when a command runs: a command loads its own workflow
    module only (what `launcher status` loads is what it needs, not stop's or doctor's)."""
    loaded = _loaded_with("launcher.commands.table")
    assert "launcher.core.requests" in loaded
    assert {"launcher.operate.stop", "launcher.deploy.doctor"} & loaded == set()


class Reached(RefusedError):
    """What the recording run function raises: every entry point turns it into exit code 4."""


REACHED: list[tuple[str, Any]] = []  # (entry point, request) for each call of `recording`
ENTRY = ["none"]


def recording(ctx: Context, request: Any) -> Any:
    """Stands in for a command's run function (through its loader in the table)."""
    assert ctx.target.name == "prod"
    REACHED.append((ENTRY[0], request))
    raise Reached(f"{type(request).__name__} reached its run function")


@pytest.mark.parametrize("name", ON_TARGETS)
def test_the_cli_the_api_and_the_tasks_reach_the_same_run_with_the_same_request(
    name: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    inventory = str(write_project(tmp_path))
    command = COMMANDS[name]
    REACHED.clear()

    class NoHost:
        """A connection nothing may use: the recording run never touches it."""

        def __getattr__(self, attribute: str) -> Any:
            raise AssertionError(f"the connection was used: {attribute}")

    monkeypatch.setattr(ConnectionPool, "get", lambda self, *a, **k: NoHost())

    row = wiring(command).row
    recorded = dataclasses.replace(command, load=lambda: Wiring(recording, row))
    monkeypatch.setitem(BY_REQUEST, command.request_type, recorded)

    ENTRY[0] = "cli"
    with pytest.raises(SystemExit) as done:
        main(["-i", inventory, name, "-t", "prod"])
    assert done.value.code == ExitCode.REFUSED

    ENTRY[0] = "api"
    with Launcher(inventory) as launcher, pytest.raises(Reached):
        getattr(launcher, name)("prod")
    ENTRY[0] = "api-run"  # the API's one call for any request
    with Launcher(inventory) as launcher, pytest.raises(Reached):
        launcher.run(command.request({}), "prod")

    ENTRY[0] = "task"
    task = getattr(tasks, name)
    given = {
        p.name: p.default for p in inspect.signature(task.body).parameters.values() if p.name != "c"
    }
    with pytest.raises(Exit) as exited:
        task.body(None, **{**given, "target": "prod", "inventory": inventory})
    assert exited.value.code == ExitCode.REFUSED

    capsys.readouterr()
    assert [entry for entry, _ in REACHED] == ["cli", "api", "api-run", "task"]
    requests = [request for _, request in REACHED]
    assert requests == [command.request({})] * 4, "the entry points' defaults drifted"


def test_run_dispatches_by_the_requests_type_only() -> None:
    with pytest.raises(KeyError):
        commands.run(None, object())  # type: ignore[arg-type]
