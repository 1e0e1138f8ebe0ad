"""Day-two commands: `logs`, `stop`, `attach`, `history`, `rollback`, `doctor`."""

from __future__ import annotations

import json
import os
import sys

import click

from launcher.cli.main import AppContext, fleet_options, pass_app, target_option


@click.command("logs")
@target_option
@click.option(
    "--tail",
    "-n",
    type=click.IntRange(min=0),
    default=50,
    show_default=True,
    metavar="N",
    help="How many of the last lines to show.",
)
@click.option(
    "-f", "--follow", is_flag=True, help="Keep printing new lines until the run ends or Ctrl-C."
)
@click.option("--raw", is_flag=True, help="Show the tmux pane (capture-pane) instead of the log.")
@pass_app
def logs_command(app: AppContext, tail: int, follow: bool, raw: bool) -> None:
    """Show the run's log file (<workdir>/.launcher/<session>.log), or follow it.

    The log holds everything the pane printed, so it works after the pane's scrollback has
    rolled over. With -f it follows until the run ends (exit file written or session gone);
    Ctrl-C stops following, never the run (exit 0).

    \b
    Example:
      launcher logs -t prod                  # the last 50 lines
      launcher logs -f --tail 5 -t prod      # follow until the run ends or Ctrl-C
      launcher logs --raw -t prod            # the pane as tmux shows it
    Exit codes: 0 shown, 1 nothing to show (no log, or no session with --raw), 3 unreachable.
    """
    from launcher.operate import logs
    from launcher.remote import ConnectionPool

    target = app.target()

    def show(line: str) -> None:
        click.echo(line)

    with ConnectionPool() as pool:
        conn = pool.get(target.host_name, target.host)
        result = logs(target, conn, tail=tail, raw=raw, follow=follow, on_line=show)
    if result.exit_code or follow:
        click.echo(result.summary, err=True)
    sys.exit(int(result.exit_code))


@click.command("stop")
@fleet_options
@click.option(
    "--grace",
    type=float,
    metavar="SECONDS",
    help="Wait this long after C-c before killing (default: playbook stop_grace).",
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
    """
    from launcher.cli.targets import exit_with, run_on_targets
    from launcher.fleet import FleetContext, Outcome
    from launcher.operate import stop
    from launcher.ui import step_line

    def work(ctx: FleetContext) -> Outcome:
        result = stop(ctx.target, ctx.conn, grace=grace)
        for step in result.steps:
            ctx.say(step_line(step.name, step.status, step.detail))
        for warning in result.warnings:
            ctx.say(step_line("warning", "warning", warning))
        stopped_something = bool(result.steps) and not result.exit_code
        summary = result.summary + ("; checkpoints untouched" if stopped_something else "")
        return Outcome(ctx.target.name, result.exit_code, summary)

    outcomes = run_on_targets(app, work)
    if len(outcomes) == 1:
        click.echo(outcomes[0].summary)
    exit_with(outcomes, title="stop")


@click.command("attach")
@target_option
@pass_app
def attach_command(app: AppContext) -> None:
    """Attach to the run's tmux session in this terminal (ssh -t, tmux attach).

    Detach with C-b d: the run goes on. Needs the system `ssh` client and a terminal.

    \b
    Example:
      launcher attach -t prod
    Exit codes: 1 no session, 2 not a terminal, 3 unreachable.
    """
    from launcher.errors import UsageError
    from launcher.operate import attach
    from launcher.remote import ConnectionPool

    target = app.target()
    with ConnectionPool() as pool:
        result = attach(target, pool.get(target.host_name, target.host))
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
@target_option
@click.option("--json", "as_json", is_flag=True, help="Print the records as a JSON list.")
@click.option(
    "--limit",
    type=click.IntRange(min=0),
    default=0,
    metavar="N",
    help="Only the newest N records (default: all).",
)
@pass_app
def history_command(app: AppContext, as_json: bool, limit: int) -> None:
    """The deploys recorded in the container, newest first.

    Each record says when, who, the script's sha256, the command, what was stopped and
    where the checkpoints went (<workdir>/.launcher/deploys.jsonl).

    \b
    Example:
      launcher history -t prod
      launcher history --json --limit 5 -t prod
    """
    from launcher.operate import history, history_lines
    from launcher.remote import ConnectionPool

    target = app.target()
    with ConnectionPool() as pool:
        result = history(target, pool.get(target.host_name, target.host), limit=limit)
    if as_json:
        click.echo(json.dumps(result.records, indent=2))
        return
    if not result.records:
        click.echo(result.summary)
        return
    for record in result.records:
        click.echo("\n".join(history_lines(record)))


@click.command("rollback")
@target_option
@click.option("--restart", is_flag=True, help="Stop the running session first (C-c, wait, kill).")
@click.option(
    "--grace",
    type=float,
    metavar="SECONDS",
    help="Wait this long after C-c (default: playbook stop_grace).",
)
@click.option(
    "--keep-checkpoints", "keep", is_flag=True, help="Leave checkpoints in place (for a resume)."
)
@pass_app
def rollback_command(app: AppContext, restart: bool, grace: float | None, keep: bool) -> None:
    """Put the previous script version back (verified like an upload) and relaunch.

    Uses <dest>.prev, kept by every deploy; afterwards .prev holds the version rolled back
    from, so a second rollback undoes the first. Refuses (exit 4) when there is no previous
    version, or a run is active and --restart was not given.

    \b
    Example:
      launcher rollback --restart -t prod
    """
    from launcher.operate import rollback
    from launcher.remote import ConnectionPool
    from launcher.ui import echo_step

    target = app.target()

    def show(step: object) -> None:
        echo_step(step.name, step.status, step.detail)  # type: ignore[attr-defined]

    with ConnectionPool() as pool:
        conn = pool.get(target.host_name, target.host)
        result = rollback(
            target, conn, restart=restart, grace=grace, keep_checkpoints=keep, on_step=show
        )
    click.echo(result.summary)


@click.command("doctor")
@fleet_options
@pass_app
def doctor_command(app: AppContext) -> None:
    """Check everything a deploy needs, and say how to fix what is wrong.

    Config, host reachable, host key, auth, pct, container exists and runs, python3 and
    tmux inside, GPUs, disk space, workdir and the deploy lock: one line per check.

    \b
    Example:
      launcher doctor -t prod
    Exit codes: 0 all pass; else the first failure's: 2 config, 3 host or container, 4 lock.
    """
    from launcher.cli.targets import exit_with, run_on_targets
    from launcher.doctor import config_failed, doctor
    from launcher.errors import LauncherError, UsageError
    from launcher.fleet import FleetContext, Outcome
    from launcher.ui import echo_step, step_line

    try:
        app.targets()
    except (LauncherError, click.UsageError) as error:
        if isinstance(error, click.UsageError):
            error = UsageError(error.message)
        failed = config_failed(error)
        for check in failed.checks:
            fix = f"  fix: {check.fix}" if check.fix else ""
            echo_step(check.name, check.status, check.detail + fix)
        click.echo(failed.summary)
        sys.exit(int(failed.exit_code))

    def work(ctx: FleetContext) -> Outcome:
        result = doctor(ctx.target, ctx.conn)
        for check in result.checks:
            fix = f"  fix: {check.fix}" if check.fix else ""
            ctx.say(step_line(check.name, check.status, check.detail + fix))
        return Outcome(ctx.target.name, result.exit_code, result.summary)

    outcomes = run_on_targets(app, work)
    if len(outcomes) == 1:
        click.echo(outcomes[0].summary)
    exit_with(outcomes, title="doctor")
