"""Every command has the one shape of launcher.workflow: a frozen Request, a typed Result (exit
code, summary, JSON form) and one run function in `commands.WORKFLOWS`; and the CLI,
`api.Launcher` and the Fabric tasks all reach that same run function with the same request."""

from __future__ import annotations

import dataclasses
import inspect
import typing
from pathlib import Path
from typing import Any

import pytest
from invoke.exceptions import Exit

from launcher import commands, tasks
from launcher.api import Launcher
from launcher.cli.main import cli, main
from launcher.commands import COMMANDS, ROWS, WORKFLOWS
from launcher.errors import ExitCode, RefusedError
from launcher.transport.pool import ConnectionPool
from launcher.workflow import Context
from tests.unit.projectfiles import write_project

# Commands of the CLI that are not one request run on targets, and why.
NOT_WORKFLOWS = {
    "attach": "replaces the process with the system ssh client (os.execvp) after one poll",
    "buckets": "local: plans sequence buckets, no target",
    "completion": "local: prints a shell's completion script",
    "disconnect": "local: ends persisted connections, no target",
    "inventory": "local: checks the inventory file",
    "job": "a multi-node job: its own phases over every node (jobdeploy, jobverify...)",
    "sandbox": "local: the staging host itself",
    "watch": "long-running: a loop of status polls and notifications",
}


def test_every_cli_command_is_a_workflow_or_says_why_not() -> None:
    for name in cli.commands:
        assert (name in COMMANDS) != (name in NOT_WORKFLOWS), name
    for name, why in NOT_WORKFLOWS.items():
        assert name in cli.commands and why.strip()


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_a_frozen_request_a_run_and_a_typed_result(name: str) -> None:
    command = COMMANDS[name]
    request = command.request({})
    assert type(request) is command.request_type
    params = dataclasses.fields(request)  # a dataclass ...
    with pytest.raises(dataclasses.FrozenInstanceError):  # ... and frozen
        setattr(request, params[0].name if params else "anything", None)
    run = command.workflow
    assert run is WORKFLOWS[command.request_type]
    hints = typing.get_type_hints(run)
    assert list(inspect.signature(run).parameters)[:2] == ["ctx", "request"]
    assert hints["ctx"] is Context
    assert isinstance(request, hints["request"])
    result = hints["return"]
    assert callable(getattr(result, "to_json", None)), f"{result.__name__} has no to_json()"
    for attribute in ("exit_code", "summary"):
        fields = {f.name for f in dataclasses.fields(result)}
        assert attribute in fields or isinstance(getattr(result, attribute, None), property), (
            f"{result.__name__} has no {attribute}"
        )
    if command.fleet:
        assert command.request_type in ROWS, f"{name}: no row for a fleet's table"


class Reached(RefusedError):
    """What the recording run function raises: every entry point turns it into exit code 4."""


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_the_cli_the_api_and_the_tasks_reach_the_same_run_with_the_same_request(
    name: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    inventory = str(write_project(tmp_path))
    command = COMMANDS[name]
    reached: list[tuple[str, Any]] = []

    class NoHost:
        """A connection nothing may use: the recording run never touches it."""

        def __getattr__(self, attribute: str) -> Any:
            raise AssertionError(f"the connection was used: {attribute}")

    monkeypatch.setattr(ConnectionPool, "get", lambda self, *a, **k: NoHost())

    def recording(ctx: Context, request: Any) -> Any:
        assert ctx.target.name == "prod"
        reached.append((entry, request))
        raise Reached(f"{name} reached its run function")

    monkeypatch.setitem(WORKFLOWS, command.request_type, recording)

    entry = "cli"
    with pytest.raises(SystemExit) as done:
        main(["-i", inventory, name, "-t", "prod"])
    assert done.value.code == ExitCode.REFUSED

    entry = "api"
    with Launcher(inventory) as launcher, pytest.raises(Reached):
        getattr(launcher, name)("prod")

    entry = "task"
    task = getattr(tasks, name)
    given = {
        p.name: p.default for p in inspect.signature(task.body).parameters.values() if p.name != "c"
    }
    with pytest.raises(Exit) as exited:
        task.body(None, **{**given, "target": "prod", "inventory": inventory})
    assert exited.value.code == ExitCode.REFUSED

    capsys.readouterr()
    assert [entry for entry, _ in reached] == ["cli", "api", "task"]
    requests = [request for _, request in reached]
    assert requests == [command.request({})] * 3, "the three entry points' defaults drifted"


def test_run_dispatches_by_the_requests_type_only() -> None:
    with pytest.raises(KeyError):
        commands.run(None, object())  # type: ignore[arg-type]
