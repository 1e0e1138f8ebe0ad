"""Day-two commands: `logs`, `stop`, `attach`, `history`, `rollback`, `doctor`."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

import click

from launcher.cli.context import AppContext, global_options, pass_app, single_target_option
from launcher.cli.declared import declared, show_on_targets
from launcher.commands.table import COMMANDS, Command, run, work
from launcher.output.termsafe import sanitize

if TYPE_CHECKING:
    from launcher.core.requests import DoctorRequest, HistoryRequest, LogsRequest


def show_logs(app: AppContext, request: LogsRequest, command: Command) -> None:
    """The run's log on one target."""
    from launcher.core.errors import UsageError
    from launcher.operate.logs import LogsResult
    from launcher.targets.fleet import run_one

    target = app.target()
    if request.raw_bytes and sys.stdout.isatty():
        raise UsageError(
            "--raw-bytes writes the run's output unfiltered: not to a terminal",
            hint="redirect it (> run.log) or pipe it; without --raw-bytes it is safe to show",
        )

    def write(data: bytes) -> None:
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()

    result: LogsResult = run_one(
        target,
        lambda ctx: run(ctx, request),
        say=lambda _: None,
        output=click.echo,
        raw_output=write if request.raw_bytes else None,
    )
    if result.exit_code or request.follow:
        click.echo(sanitize(result.summary, keep_sgr=False), err=True)
    sys.exit(int(result.exit_code))


logs_command = declared(COMMANDS["logs"], show_logs)
stop_command = declared(COMMANDS["stop"])


@click.command("attach")
@single_target_option
@global_options
@pass_app
def attach_command(app: AppContext) -> None:
    """Attach to the run's tmux session in this terminal (ssh -t, tmux attach).

    Detach with C-b d: the run goes on. Needs the system `ssh` client and a terminal.

    \b
    Example:
      launcher attach -t prod
    Exit codes: 0 detached, 1 no session, 2 not a terminal or bad input, 3 unreachable.
    """
    from launcher.core.errors import UsageError
    from launcher.operate.attach import attach
    from launcher.targets.fleet import on_target

    result = on_target(app.target(), attach)
    if result.exit_code:
        click.echo(f"error: {result.summary}", err=True)
        sys.exit(int(result.exit_code))
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise UsageError("attach needs a terminal (stdin and stdout must be a TTY)")
    click.echo(result.summary, err=True)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvp(result.argv[0], result.argv)


def show_history(app: AppContext, request: HistoryRequest, command: Command) -> None:
    """The deploy records on the app's targets."""
    from launcher.cli.targets import emit_json, exit_with, run_on_targets
    from launcher.operate.history import diff_lines, history_lines

    outcomes = run_on_targets(app, work(request))
    if request.json:
        emit_json("history", outcomes)
        exit_with(outcomes, title="history", table=False)
    for outcome in outcomes:
        if outcome.error is not None:
            continue  # printed on stderr (one target) or in the table (several)
        if len(outcomes) > 1:
            click.echo(f"== {outcome.target}")
        if outcome.data.get("diff") is not None:
            click.echo("\n".join(diff_lines(outcome.data["diff"])))
            continue
        records = outcome.data["records"]
        if not records:
            click.echo(sanitize(outcome.summary, keep_sgr=False))
        for record in records:
            click.echo("\n".join(history_lines(record)))
    exit_with(outcomes, title="history")


history_command = declared(COMMANDS["history"], show_history)
rollback_command = declared(COMMANDS["rollback"])


def show_doctor(app: AppContext, request: DoctorRequest, command: Command) -> None:
    """Every check on the app's targets. An inventory that does not load is doctor's first
    failed check, not an error."""
    from launcher.core.errors import LauncherError, UsageError
    from launcher.deploy.doctor import check_fix, config_failed
    from launcher.output.ui import progress_line, step_line

    try:
        app.targets()
    except (LauncherError, click.UsageError) as error:
        if isinstance(error, click.UsageError):
            error = UsageError(error.message)
        failed = config_failed(error)
        for check in failed.checks:
            progress_line(step_line(check.name, check.status, check.detail + check_fix(check)))
        click.echo(failed.summary, err=True)
        sys.exit(int(failed.exit_code))
    show_on_targets(app, request, command)


doctor_command = declared(COMMANDS["doctor"], show_doctor)


@click.command("disconnect")
def disconnect_command() -> None:
    """End this user's persisted connections.

    Each ends after its idle time anyway; this ends them now, e.g. after changing
    ssh_config, which a persisted connection keeps as it was when it connected.

    \b
    Example:
      launcher disconnect
    Exit codes: 0 (also when there was none).
    """
    from launcher.operate.disconnect import disconnect

    click.echo(f"ended {disconnect()} persisted connection(s)")
