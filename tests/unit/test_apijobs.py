"""`Launcher.jobs` and `launcher job` reach the same function of launcher.commands.jobs with the
same request, every job command has its API method, and bad values are refused before anything
opens."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from launcher.api import Launcher
from launcher.apijobs import Jobs
from launcher.cli.main import cli, main
from launcher.commands import jobs as jobcommands
from launcher.core.errors import ExitCode, RefusedError, UsageError
from tests.unit.test_job import JOB, inventory_with


class Reached(RefusedError):
    """What the recording job command raises: the CLI turns it into exit code 4."""


def recorder(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Any]]:
    """Every jobcommands function replaced by one that records its request (and the
    inventory's path) and raises Reached."""
    calls: list[tuple[str, Any]] = []

    def recording(name: str) -> Callable[..., Any]:
        def record(inventory: Any, request: Any, sinks: Any = None) -> Any:
            calls.append((name, (str(inventory.path), request)))
            raise Reached(f"job {name} reached")

        return record

    for name in COMMANDS:
        monkeypatch.setattr(jobcommands, name, recording(name))
    return calls


# Each job command: the CLI's arguments and the API call that must mean the same.
COMMANDS: dict[str, tuple[list[str], Callable[[Jobs], Any]]] = {
    "deploy": (
        ["--restart", "--dry-run", "--grace", "30", "--keep-checkpoints", "--kill-gpu-holders"],
        lambda jobs: jobs.deploy(
            "train",
            restart=True,
            dry_run=True,
            grace=30,
            checkpoints="keep",
            kill_gpu_holders=True,
        ),
    ),
    "verify": (
        ["--wait", "60", "--interval", "2", "--successes", "3"],
        lambda jobs: jobs.verify("train", wait=60, interval=2, successes=3),
    ),
    "status": ([], lambda jobs: jobs.status("train")),
    "stop": (["--grace", "5"], lambda jobs: jobs.stop("train", grace=5)),
    "history": (["--limit", "2"], lambda jobs: jobs.history("train", limit=2)),
    "rollback": (
        ["--restart", "--dry-run", "--grace", "7", "--keep-checkpoints"],
        lambda jobs: jobs.rollback(
            "train", restart=True, dry_run=True, grace=7, keep_checkpoints=True
        ),
    ),
    "logs": (
        ["--node", "prod", "-n", "20", "--raw"],
        lambda jobs: jobs.logs("train", node="prod", tail=20, raw=True),
    ),
    "watch": (
        ["--interval", "2", "--for", "60", "--restart-on-failure", "--max-restarts", "2"],
        lambda jobs: jobs.watch(
            "train", interval=2, duration=60, restart_on_failure=True, max_restarts=2
        ),
    ),
}


def test_every_job_command_has_an_api_method() -> None:
    group = cli.commands["job"]
    assert set(group.commands) == set(COMMANDS)  # type: ignore[attr-defined]
    methods = {name for name, _ in inspect.getmembers(Jobs, inspect.isfunction)}
    assert set(COMMANDS) <= methods
    own = inspect.getmembers(jobcommands, inspect.isfunction)
    public = {n for n, f in own if f.__module__ == jobcommands.__name__ and n[0] != "_"}
    assert set(COMMANDS) == public


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_the_cli_and_the_api_reach_the_same_job_command(
    command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = recorder(monkeypatch)
    inventory = inventory_with(tmp_path, JOB)
    monkeypatch.setenv("LAUNCHER_CONTROL_PERSIST", "0")
    cli_args, api_call = COMMANDS[command]
    with pytest.raises(SystemExit) as exited:
        main(["-i", str(inventory), "job", command, *cli_args, "train"])
    assert exited.value.code == ExitCode.REFUSED
    with Launcher(inventory) as launcher, pytest.raises(Reached):
        api_call(launcher.jobs)
    (cli_name, cli_values), (api_name, api_values) = calls
    assert cli_name == api_name == command
    assert cli_values == api_values


@pytest.mark.parametrize(
    "call",
    [
        lambda jobs: jobs.deploy("train", checkpoints="nope"),
        lambda jobs: jobs.deploy("train", restart="yes"),
        lambda jobs: jobs.deploy(3),
        lambda jobs: jobs.verify("train", successes=0),
        lambda jobs: jobs.verify("train", wait="forever"),
        lambda jobs: jobs.status("train", 5),
        lambda jobs: jobs.stop("train", grace=-1),
        lambda jobs: jobs.history("train", limit=-1),
        lambda jobs: jobs.rollback("train", grace=10**9),
        lambda jobs: jobs.logs("train", tail="5"),
        lambda jobs: jobs.logs("train", node=1),
        lambda jobs: jobs.watch("train", interval=0.1),
        lambda jobs: jobs.watch("train", interval=None),
        lambda jobs: jobs.watch("train", max_restarts=1001),
        lambda jobs: jobs.watch("train", stop=True),
    ],
)
def test_bad_values_are_usage_errors_before_anything_runs(
    call: Callable[[Jobs], Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = recorder(monkeypatch)
    with Launcher(inventory_with(tmp_path, JOB)) as launcher, pytest.raises(UsageError):
        call(launcher.jobs)
    assert calls == []


def test_an_unknown_job_is_a_usage_error_naming_the_jobs(tmp_path: Path) -> None:
    with Launcher(inventory_with(tmp_path, JOB)) as launcher:
        assert launcher.jobs.names() == ["train"]
        with pytest.raises(UsageError, match="nope"):
            launcher.jobs.status("nope")
