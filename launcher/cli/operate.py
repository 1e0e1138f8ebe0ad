"""Day-two commands: `logs`, `stop`, `attach`, `history`, `rollback`, `doctor`."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

import click

from launcher.cli.context import (
    AppContext,
    fleet_options,
    global_options,
    pass_app,
    single_target_option,
)
from launcher.commands.params import GRACE, LINES, wait_lock_option
from launcher.output.termsafe import sanitize

if TYPE_CHECKING:
    from launcher.core.requests import (
        DoctorRequest,
        HistoryRequest,
        LogsRequest,
        RollbackRequest,
        StopRequest,
    )


@click.command("logs")
@single_target_option
@global_options
@click.option(
    "--tail",
    "-n",
    type=LINES,
    default=50,
    show_default=True,
    metavar="N",
    help="How many of the last lines to show.",
)
@click.option(
    "-f", "--follow", is_flag=True, help="Keep printing new lines until the run ends or Ctrl-C."
)
@click.option("--raw", is_flag=True, help="Show the tmux pane (capture-pane) instead of the log.")
@click.option(
    "--raw-bytes",
    is_flag=True,
    help="Write the log unfiltered, escape sequences and all (not to a terminal: exit 2).",
)
@pass_app
def logs_command(app: AppContext, tail: int, follow: bool, raw: bool, raw_bytes: bool) -> None:
    """Show the run's log file (<workdir>/.launcher/<session>.log), or follow it.

    The log holds everything the pane printed, so it works after the pane's scrollback has
    rolled over. With -f it follows until the run ends (exit file written or session gone);
    Ctrl-C stops following, never the run (exit 0).

    What the run printed is shown without the control characters and escape sequences a
    terminal would act on (window title, clipboard, terminal queries...); SGR colours stay.
    --raw-bytes writes it unchanged, and only into a file or a pipe.

    \b
    Example:
      launcher logs -t prod                  # the last 50 lines
      launcher logs -f --tail 5 -t prod      # follow until the run ends or Ctrl-C
      launcher logs --raw -t prod            # the pane as tmux shows it
      launcher logs --raw-bytes -t prod > run.log
    Exit codes: 0 shown, 1 nothing to show (no log, or no session with --raw), 2 --raw-bytes
    on a terminal, 3 unreachable, 141 the reader went away (`| head`).
    """
    from launcher.commands.table import COMMANDS

    values = {"tail": tail, "follow": follow, "raw": raw, "raw_bytes": raw_bytes}
    COMMANDS["logs"].run(app, values)


def run_logs(app: AppContext, request: LogsRequest, *, raw_bytes: bool) -> None:
    """The run's log on one target (also `launcher.tasks.logs`)."""
    from launcher.commands.table import run
    from launcher.core.errors import UsageError
    from launcher.operate.logs import LogsResult
    from launcher.targets.fleet import run_one

    target = app.target()
    if raw_bytes and sys.stdout.isatty():
        raise UsageError(
            "--raw-bytes writes the run's output unfiltered: not to a terminal",
            hint="redirect it (> run.log) or pipe it; without --raw-bytes it is safe to show",
        )

    def show(line: str) -> None:
        click.echo(line)

    def write(data: bytes) -> None:
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()

    result: LogsResult = run_one(
        target,
        lambda ctx: run(ctx, request),
        say=lambda _: None,
        output=show,
        raw_output=write if raw_bytes else None,
    )
    if result.exit_code or request.follow:
        click.echo(sanitize(result.summary, keep_sgr=False), err=True)
    sys.exit(int(result.exit_code))


@click.command("stop")
@fleet_options
@click.option(
    "--grace",
    type=GRACE,
    metavar="DURATION",
    help="Wait this long after C-c before killing: 90, 2m; 0 s to 1 h (default: playbook "
    "stop_grace, itself 30 s by default).",
)
@pass_app
def stop_command(app: AppContext, grace: float | None) -> None:
    """Stop the run gracefully: C-c, wait, kill the session and any leftover process.

    The same stop as `deploy --restart`; it confirms no process of the run is left and
    that the GPUs are free. Checkpoints are not touched. No session: says so, exit 0.

    \b
    Example:
      launcher stop -t prod
      launcher stop --grace 120 -t prod      # give the trainer two minutes to save
    Steps go to stderr (-q: none); the summary to stdout.
    Exit codes: 0 stopped (or nothing to stop), 2 bad input, 3 unreachable or the stop
    failed, 4 refused (lock held); a fleet: the worst.
    """
    from launcher.commands.table import COMMANDS

    COMMANDS["stop"].run(app, {"grace": grace})


def run_stop(app: AppContext, request: StopRequest) -> None:
    """Stop the run on the app's targets (also `launcher.tasks.stop`)."""
    from launcher.cli.targets import exit_with, run_on_targets, say_result
    from launcher.commands.table import work

    outcomes = run_on_targets(app, work(request))
    say_result(outcomes)
    exit_with(outcomes, title="stop")


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


@click.command("history")
@fleet_options
@click.option(
    "--json", "as_json", is_flag=True, help="Print the records as JSON (schema launcher.history/1)."
)
@click.option(
    "--limit",
    type=LINES,
    default=0,
    metavar="N",
    help="Only the newest N records (default: all).",
)
@click.option(
    "--diff",
    nargs=2,
    default=None,
    metavar="A B",
    help="What changed from run A to run B: code, command, env names, overrides (run ids, or "
    "the start of them).",
)
@pass_app
def history_command(
    app: AppContext, as_json: bool, limit: int, diff: tuple[str, str] | None
) -> None:
    """The deploys recorded in the container, newest first.

    Each record says when, who, the script's sha256, the command, what was stopped and
    where the checkpoints went (<workdir>/.launcher/deploys.jsonl). Several targets: each
    one's records under its name, then one table.

    \b
    Example:
      launcher history -t prod
      launcher history --json --limit 5 -t prod
      launcher history --limit 1 --all
      launcher history --diff 20261207T0101 20261207T0215 -t prod
    Exit codes: 0 shown (also when none are recorded), 2 bad input, 3 unreachable;
    a fleet: the worst.
    """
    from launcher.commands.table import COMMANDS

    COMMANDS["history"].run(app, {"limit": limit, "diff": diff or (), "json": as_json})


def run_history(app: AppContext, request: HistoryRequest, *, json: bool) -> None:
    """The deploy records on the app's targets (also `launcher.tasks.history`)."""
    from launcher.cli.targets import emit_json, exit_with, run_on_targets
    from launcher.commands.table import work
    from launcher.operate.history import diff_lines, history_lines

    outcomes = run_on_targets(app, work(request))
    if json:
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


@click.command("rollback")
@fleet_options
@click.option("--restart", is_flag=True, help="Stop the running session first (C-c, wait, kill).")
@click.option(
    "--grace",
    type=GRACE,
    metavar="DURATION",
    help="Wait this long after C-c: 90, 2m; 0 s to 1 h (default: playbook stop_grace, itself "
    "30 s by default).",
)
@click.option(
    "--keep-checkpoints", "keep", is_flag=True, help="Leave checkpoints in place (for a resume)."
)
@wait_lock_option
@click.option(
    "--no-checkpoints",
    "fresh",
    is_flag=True,
    help="Start fresh: leave the put-back run's archived checkpoints archived.",
)
@pass_app
def rollback_command(
    app: AppContext, restart: bool, grace: float | None, keep: bool, wait_lock: float, fresh: bool
) -> None:
    """Put the previous run back: its script (verified like an upload), command, environment
    and checkpoints, and relaunch.

    The run the current one replaced: its script from the copies every deploy keeps (or
    <dest>.prev), its command and env as it was launched with them, and its checkpoints moved
    back in place from their archive when it is there (the current run's go to an archive of
    their own; --no-checkpoints: start fresh; --keep-checkpoints: leave the current ones). A
    second rollback undoes the first. Refuses (exit 4) when there is no previous version, or a
    run is active and --restart was not given.

    \b
    Example:
      launcher rollback --restart -t prod
      launcher rollback --restart -t canary,prod   # several: in parallel, one table
    Steps go to stderr (-q: none); the summary to stdout.
    Exit codes: 0 rolled back, 2 bad input, 3 unreachable or a step failed, 4 refused
    (no previous version, lock held, run active without --restart); a fleet: the worst.
    """
    from launcher.commands.table import COMMANDS

    values = {
        "restart": restart,
        "grace": grace,
        "keep_checkpoints": keep,
        "wait_lock": wait_lock,
        "no_checkpoints": fresh,
    }
    COMMANDS["rollback"].run(app, values)


def run_rollback(app: AppContext, request: RollbackRequest) -> None:
    """Roll back on the app's targets (also `launcher.tasks.rollback`)."""
    from launcher.cli.targets import exit_with, run_on_targets, say_result
    from launcher.commands.table import work

    outcomes = run_on_targets(app, work(request))
    say_result(outcomes)
    exit_with(outcomes, title="rollback")


@click.command("doctor")
@fleet_options
@click.option(
    "--json", "as_json", is_flag=True, help="Print the checks as JSON (schema launcher.doctor/1)."
)
@pass_app
def doctor_command(app: AppContext, as_json: bool) -> None:
    """Check everything a deploy needs, and say how to fix what is wrong.

    Config, host reachable, host key, auth, pct, container exists and runs, python3 and
    tmux inside, GPUs, disk space, workdir and the deploy lock: one line per check, on
    stderr (-q: none); the summary, a fleet's table or --json on stdout.

    \b
    Example:
      launcher doctor -t prod
      launcher doctor --all --json > doctor.json
    Exit codes: 0 all pass; else the first failure's: 2 config, 3 host or container, 4 lock;
    a fleet: the worst.
    """
    from launcher.commands.table import COMMANDS

    COMMANDS["doctor"].run(app, {"json": as_json})


def run_doctor(app: AppContext, request: DoctorRequest, *, json: bool) -> None:
    """Every check on the app's targets (also `launcher.tasks.doctor`). An inventory that
    does not load is doctor's first failed check, not an error."""
    from launcher.cli.targets import emit_json, exit_with, run_on_targets, say_result
    from launcher.commands.table import work
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

    outcomes = run_on_targets(app, work(request))
    if json:
        emit_json("doctor", outcomes)
    else:
        say_result(outcomes)
    exit_with(outcomes, title="doctor", table=not json)


@click.command("disconnect")
def disconnect_command() -> None:
    """End this user's persisted connections and command servers.

    Each ends after its idle time anyway; this ends them now, e.g. after changing
    ssh_config, which a persisted connection keeps as it was when it connected.

    \b
    Example:
      launcher disconnect
    Exit codes: 0 (also when there was none).
    """
    from launcher.operate.disconnect import disconnect

    connections, servers = disconnect()
    click.echo(f"ended {connections} persisted connection(s) and {servers} command server(s)")
