"""`launcher job`: the job commands of the table (their requests: core/jobrequests.py), each
shown as the CLI shows a job: node by node, or its JSON envelope."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from launcher.cli.context import AppContext
from launcher.cli.declared import Show, declared
from launcher.commands.table import COMMANDS, Command, wiring

if TYPE_CHECKING:
    from launcher.core.jobrequests import (
        JobHistoryRequest,
        JobLogsRequest,
        JobStatusRequest,
        JobWatchRequest,
    )
    from launcher.jobs.deploy import JobResult


@click.group("job")
def job() -> None:
    """One training run across several containers: the inventory's `jobs:`.

    A job names its nodes (targets, in rank order) and one playbook. Every node's run gets
    NNODES, NODE_RANK, MASTER_ADDR, MASTER_PORT and JOB_ID in its environment.

    \b
    Example:
      launcher job deploy --restart train && launcher job verify train
      launcher job status
      launcher job history train
      launcher job logs -f train
      launcher job rollback --restart train
      launcher job stop train
    """


def _say(app: AppContext) -> Callable[[str, str], None]:
    from launcher.output.termsafe import sanitize

    def say(node: str, line: str) -> None:
        if not app.quiet:
            click.echo(f"[{node}] {sanitize(line, keep_sgr=False)}", err=True)

    return say


def _emit(command: str, documents: list[dict[str, Any]], exit_code: int) -> None:
    """The `--json` envelope every command prints (launcher/schemas/job-*.schema.json): one
    item per job, its fields repeated at the top level when there is one."""
    from launcher.output.jsonout import emit, envelope

    emit(envelope(f"job-{command}", documents, exit_code=exit_code))


def _render(result: JobResult, as_json: bool) -> None:
    from launcher.output.termsafe import sanitize

    if as_json:
        _emit(result.action, [result.to_json()], int(result.exit_code))
        return
    click.echo(sanitize(f"job {result.job}: {result.summary}", keep_sgr=False))
    for node in result.nodes:
        line = f"  rank {node.rank}  {node.node:<12} {node.state:<10} {node.detail}"
        click.echo(sanitize(line, keep_sgr=False))


def _run(app: AppContext, request: Any, command: Command, **sinks: Any) -> Any:
    from launcher.commands.jobs import JobSinks

    return wiring(command).run(app.inventory(), request, JobSinks(say=_say(app), **sinks))


def show_job(app: AppContext, request: Any, command: Command) -> None:
    """A phase over every node (deploy, verify, stop, rollback): its result, node by node."""
    result = _run(app, request, command)
    _render(result, request.json)
    sys.exit(int(result.exit_code))


def show_status(app: AppContext, request: JobStatusRequest, command: Command) -> None:
    from launcher.targets.fleet import worst

    results = _run(app, request, command)
    code = int(worst([r.exit_code for r in results]))
    if request.json:
        _emit("status", [r.to_json() for r in results], code)
    else:
        for result in results:
            _render(result, False)
    sys.exit(code)


def show_history(app: AppContext, request: JobHistoryRequest, command: Command) -> None:
    from launcher.output.termsafe import sanitize

    result = _run(app, request, command)
    if request.json:
        _emit("history", [result.to_json()], int(result.exit_code))
    else:
        if not result.runs:
            click.echo(f"job {request.name}: no deploys recorded")
        for run in result.runs:
            outcomes = ", ".join(f"{node}: {outcome}" for node, outcome in run.outcomes.items())
            line = f"{run.time}  run {run.run_id}  sha256 {run.sha256[:12]}  {outcomes}"
            click.echo(sanitize(line, keep_sgr=False))
        for node, error in result.errors.items():
            click.echo(sanitize(f"error: {node}: {error}", keep_sgr=False), err=True)
    sys.exit(int(result.exit_code))


def show_watch(app: AppContext, request: JobWatchRequest, command: Command) -> None:
    from launcher.output.termsafe import sanitize
    from launcher.watch.job import terminated_by_sigterm

    app.inventory()

    def event(line: str) -> None:
        click.echo(sanitize(line, keep_sgr=False))

    with terminated_by_sigterm() as stop:
        result = _run(app, request, command, event=event, stop=stop)
    sys.exit(int(result.exit_code))


def show_logs(app: AppContext, request: JobLogsRequest, command: Command) -> None:
    from launcher.output.termsafe import sanitize

    def show(node_name: str, line: str) -> None:
        # The line is sanitised already (operate.logs); the node's name comes from the inventory.
        click.echo(f"[{node_name}] {line}")

    result = _run(app, request, command, line=show)
    for outcome in result.nodes:
        if outcome.exit_code or request.follow:
            click.echo(sanitize(f"[{outcome.node}] {outcome.summary}", keep_sgr=False), err=True)
    sys.exit(int(result.exit_code))


SHOWS: dict[str, Show] = {
    "status": show_status,
    "history": show_history,
    "watch": show_watch,
    "logs": show_logs,
}
for _name in ("deploy", "verify", "status", "stop", "history", "watch", "rollback", "logs"):
    job.add_command(declared(COMMANDS[f"job {_name}"], SHOWS.get(_name, show_job)))
