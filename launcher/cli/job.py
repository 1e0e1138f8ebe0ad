"""`launcher job`: deploy, verify, status and stop of a multi-node job (inventory `jobs:`)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from launcher.cli.context import AppContext, global_options, pass_app
from launcher.commands.params import (
    GRACE,
    INTERVAL,
    LINES,
    MAX_RESTARTS,
    PORT,
    RESTART_BACKOFF,
    RESTART_WINDOW,
    SUCCESSES,
    WAIT,
    WATCH_FOR,
)

if TYPE_CHECKING:
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


_JSON = click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")


@job.command("deploy")
@click.argument("name")
@global_options
@click.option("--restart", is_flag=True, help="Stop every node's running session first.")
@click.option("--dry-run", is_flag=True, help="Every node's plan and checks; change nothing.")
@click.option("--grace", type=GRACE, metavar="DURATION", help="Wait this long after C-c.")
@click.option("--purge-checkpoints", "purge", is_flag=True, help="Delete old checkpoints.")
@click.option("--keep-checkpoints", "keep", is_flag=True, help="Leave checkpoints in place.")
@click.option(
    "--kill-gpu-holders",
    is_flag=True,
    help="Kill processes outside the old runs that hold the GPUs (default: refuse, exit 4).",
)
@click.option(
    "--keep-partial",
    is_flag=True,
    help="A launch that fails on some nodes leaves the others running (default: they are "
    "stopped again).",
)
@_JSON
@pass_app
def deploy_command(
    app: AppContext,
    name: str,
    restart: bool,
    dry_run: bool,
    grace: float | None,
    purge: bool,
    keep: bool,
    kill_gpu_holders: bool,
    keep_partial: bool,
    as_json: bool,
) -> None:
    """Deploy job NAME on all its nodes, or on none.

    Every node's network (rank 0's master port reached from every node, the rendezvous torchrun
    gets) and checks (script, GPUs, disk, lock, active session) pass before any old run is
    stopped; then every old run stops (--restart); then every node launches, all with one run
    id. A launch that fails on some nodes is undone on the others (unless --keep-partial); a
    node that fails after the first stop is reported with the state each node was left in.

    \b
    Examples:
      launcher job deploy --restart --dry-run train   # every node's plan
      launcher job deploy --restart train
    Exit codes: 0 deployed (or planned), 2 bad input, 3 unreachable or a step failed,
    4 refused on a node (lock held, run active, GPUs busy): the worst node's.
    """
    from launcher.commands import jobs as jobcommands
    from launcher.core.errors import UsageError
    from launcher.deploy.deploy import DeployOptions

    if purge and keep:
        raise UsageError("--purge-checkpoints and --keep-checkpoints exclude each other")
    options = DeployOptions(
        restart=restart,
        dry_run=dry_run,
        checkpoint_mode="purge" if purge else "keep" if keep else "archive",
        grace=grace,
        kill_gpu_holders=kill_gpu_holders,
    )
    result = jobcommands.deploy(
        app.inventory(), name, options, _say(app), keep_partial=keep_partial
    )
    _render(result, as_json)
    sys.exit(int(result.exit_code))


@job.command("verify")
@click.argument("name")
@global_options
@click.option("--wait", type=WAIT, metavar="DURATION", help="How long the probe may take.")
@click.option("--interval", type=INTERVAL, metavar="DURATION", help="Between polls.")
@click.option("--successes", type=SUCCESSES, metavar="N", help="Healthy polls needed.")
@_JSON
@pass_app
def verify_command(
    app: AppContext,
    name: str,
    wait: float | None,
    interval: float | None,
    successes: int | None,
    as_json: bool,
) -> None:
    """One verdict for job NAME: the status rank's startup probe, every node alive.

    The status rank (jobs.NAME.status_rank, default 0) is probed as `launcher verify` probes
    a target; every other node must keep its session, its run's process and the same run
    throughout. A node that dies ends the probe: the job is unhealthy and the report names it.

    \b
    Example:
      launcher job verify --wait 3m train
    Exit codes: 0 healthy, 1 unhealthy, 2 bad input, 3 a node unreachable.
    """
    from launcher.commands import jobs as jobcommands
    from launcher.core.requests import ProbeOverrides

    overrides = ProbeOverrides(wait=wait, interval=interval, successes=successes)
    result = jobcommands.verify(app.inventory(), name, overrides, _say(app))
    _render(result, as_json)
    sys.exit(int(result.exit_code))


@job.command("status")
@click.argument("names", nargs=-1)
@global_options
@_JSON
@pass_app
def status_command(app: AppContext, names: tuple[str, ...], as_json: bool) -> None:
    """One line per job (default: every job) and one per node, from one poll of each.

    \b
    Example:
      launcher job status train
    Exit codes: 0 every job healthy, 1 a job unhealthy, 2 bad input, 3 a node unreachable.
    """
    from launcher.commands import jobs as jobcommands
    from launcher.targets.fleet import worst

    results = jobcommands.status(app.inventory(), names)
    code = int(worst([r.exit_code for r in results]))
    if as_json:
        _emit("status", [r.to_json() for r in results], code)
    else:
        for result in results:
            _render(result, False)
    sys.exit(code)


@job.command("stop")
@click.argument("name")
@global_options
@click.option("--grace", type=GRACE, metavar="DURATION", help="Wait this long after C-c.")
@_JSON
@pass_app
def stop_command(app: AppContext, name: str, grace: float | None, as_json: bool) -> None:
    """Stop job NAME on every node at once; each node's outcome is reported.

    \b
    Example:
      launcher job stop --grace 2m train
    Exit codes: 0 stopped everywhere (or nothing to stop), 2 bad input, 3 a node unreachable
    or not stopped completely, 4 refused (lock held).
    """
    from launcher.commands import jobs as jobcommands

    result = jobcommands.stop(app.inventory(), name, grace, _say(app))
    _render(result, as_json)
    sys.exit(int(result.exit_code))


@job.command("history")
@click.argument("name")
@global_options
@click.option("--limit", type=LINES, default=0, metavar="N", help="Only the newest N runs.")
@_JSON
@pass_app
def history_command(app: AppContext, name: str, limit: int, as_json: bool) -> None:
    """Job NAME's deploys, newest first: one line per run id, each node's outcome.

    Read from every node's own records (<workdir>/.launcher/deploys.jsonl); a node without a
    record of a run shows `no record`.

    \b
    Example:
      launcher job history --limit 5 train
    Exit codes: 0 shown, 2 bad input, 3 a node unreachable (the others are still shown).
    """
    from launcher.commands import jobs as jobcommands
    from launcher.output.termsafe import sanitize

    result = jobcommands.history(app.inventory(), name, limit)
    if as_json:
        _emit("history", [result.to_json()], int(result.exit_code))
    else:
        if not result.runs:
            click.echo(f"job {name}: no deploys recorded")
        for run in result.runs:
            outcomes = ", ".join(f"{node}: {outcome}" for node, outcome in run.outcomes.items())
            line = f"{run.time}  run {run.run_id}  sha256 {run.sha256[:12]}  {outcomes}"
            click.echo(sanitize(line, keep_sgr=False))
        for node, error in result.errors.items():
            click.echo(sanitize(f"error: {node}: {error}", keep_sgr=False), err=True)
    sys.exit(int(result.exit_code))


@job.command("watch")
@click.argument("name")
@global_options
@click.option("--interval", type=INTERVAL, metavar="DURATION", help="Between polls (default 10s).")
@click.option("--for", "duration", type=WATCH_FOR, metavar="DURATION", help="End after this long.")
@click.option(
    "--restart-on-failure",
    is_flag=True,
    help="Redeploy the whole job with its checkpoints kept (every rank resumes).",
)
@click.option(
    "--max-restarts", type=MAX_RESTARTS, default=3, show_default=True, metavar="N",
    help="At most N restarts in --restart-window; then the job is stopped (exit 1).",
)  # fmt: skip
@click.option(
    "--restart-window", type=RESTART_WINDOW, default=3600.0, metavar="DURATION",
    help="The sliding window --max-restarts counts in (default 1h).",
)  # fmt: skip
@click.option(
    "--restart-backoff", type=RESTART_BACKOFF, default=10.0, metavar="DURATION",
    help="Wait before the first restart in a window, doubled for each further one (default 10s).",
)  # fmt: skip
@click.option(
    "--webhook", "webhooks", multiple=True, metavar="URL",
    help="POST each event as JSON (schema launcher.watch.event/1). Repeatable.",
)  # fmt: skip
@click.option(
    "--exec", "commands", multiple=True, metavar="CMD",
    help="Run CMD for each event, with the event in LAUNCHER_EVENT_* variables. Repeatable.",
)  # fmt: skip
@click.option("--metrics-port", type=PORT, metavar="PORT", help="Serve Prometheus metrics.")
@click.option(
    "--metrics-address", default="127.0.0.1", show_default=True, metavar="ADDR",
    help="Address the metrics server binds to.",
)  # fmt: skip
@click.option(
    "--state", "state_file", type=click.Path(dir_okay=False, path_type=Path),
    help="State file (default: one per inventory and job under $XDG_STATE_HOME/launcher/watch/).",
)  # fmt: skip
@pass_app
def watch_command(
    app: AppContext,
    name: str,
    interval: float | None,
    duration: float | None,
    restart_on_failure: bool,
    max_restarts: int,
    restart_window: float,
    restart_backoff: float,
    webhooks: tuple[str, ...],
    commands: tuple[str, ...],
    metrics_port: int | None,
    metrics_address: str,
    state_file: Path | None,
) -> None:
    """Watch job NAME as `launcher watch` watches a target: each transition an event.

    Its one verdict (`job status`) polled; transitions go to stdout, to the state file's events
    log and to every --webhook and --exec (schema launcher.watch.event/1; the event's target is
    the job); --metrics-port serves each node's status and GPUs. A failure is two unhealthy
    polls in a row, or one that finds a node's run gone, restarted or replaced.
    --restart-on-failure redeploys the whole job (all or nothing, a new run id, checkpoints
    kept) after a backoff and runs its startup probe, at most --max-restarts times in
    --restart-window; then the job is stopped. A finished job is never restarted.

    \b
    Example:
      launcher job watch --restart-on-failure --for 12h --webhook https://hooks.slack.com/... train
    Exit codes (at --for's end, as `launcher watch`): 0 healthy or finished, 1 unhealthy or
    stopped after the last restart, 2 bad input, 3 a node unreachable or a restart failed;
    SIGTERM ends it with 0, Ctrl-C with 130.
    """
    from launcher.commands import jobs as jobcommands
    from launcher.output.termsafe import sanitize
    from launcher.watch.job import JobWatchOptions, terminated_by_sigterm

    inventory = app.inventory()
    options = JobWatchOptions(
        interval=interval if interval is not None else 10.0,
        duration=duration,
        restart_on_failure=restart_on_failure,
        max_restarts=max_restarts,
        restart_window=restart_window,
        restart_backoff=restart_backoff,
        state_path=state_file,
        webhooks=webhooks,
        commands=commands,
        metrics_port=metrics_port,
        metrics_address=metrics_address,
    )

    def event(line: str) -> None:
        click.echo(sanitize(line, keep_sgr=False))

    with terminated_by_sigterm() as stop:
        result = jobcommands.watch(inventory, name, options, say=_say(app), event=event, stop=stop)
    sys.exit(int(result.exit_code))


@job.command("rollback")
@click.argument("name")
@global_options
@click.option("--restart", is_flag=True, help="Stop every node's running session first.")
@click.option("--dry-run", is_flag=True, help="Every node's rollback checks; change nothing.")
@click.option("--grace", type=GRACE, metavar="DURATION", help="Wait this long after C-c.")
@click.option("--keep-checkpoints", "keep", is_flag=True, help="Leave checkpoints in place.")
@_JSON
@pass_app
def rollback_command(
    app: AppContext,
    name: str,
    restart: bool,
    dry_run: bool,
    grace: float | None,
    keep: bool,
    as_json: bool,
) -> None:
    """Roll job NAME back to its previous version on all its nodes, or on none.

    As `launcher rollback` on every node (each node's previous script version, <dest>.prev),
    all or nothing as `job deploy`: every node's checks (a previous version there, lock,
    active session) pass before any old run is stopped; then every old run stops (--restart);
    then every node relaunches, all with one new run id. A node that fails after the first
    stop is reported with the state each node was left in.

    \b
    Examples:
      launcher job rollback --restart --dry-run train   # every node's checks
      launcher job rollback --restart train
    Exit codes: 0 rolled back (or planned), 2 bad input, 3 unreachable or a step failed,
    4 refused on a node (no previous version, lock held, run active): the worst node's.
    """
    from launcher.commands import jobs as jobcommands
    from launcher.jobs.rollback import JobRollbackOptions

    options = JobRollbackOptions(
        restart=restart, dry_run=dry_run, keep_checkpoints=keep, grace=grace
    )
    result = jobcommands.rollback(app.inventory(), name, options, _say(app))
    _render(result, as_json)
    sys.exit(int(result.exit_code))


@job.command("logs")
@click.argument("name")
@global_options
@click.option("--node", metavar="NAME", help="Only this node's lines (default: every node).")
@click.option(
    "--tail", "-n", type=LINES, default=50, show_default=True, metavar="N",
    help="How many of each node's last lines to show.",
)  # fmt: skip
@click.option(
    "-f", "--follow", is_flag=True,
    help="Keep printing every node's new lines until every run ends or Ctrl-C.",
)  # fmt: skip
@click.option("--raw", is_flag=True, help="Show each tmux pane instead of each log.")
@pass_app
def logs_command(
    app: AppContext, name: str, node: str | None, tail: int, follow: bool, raw: bool
) -> None:
    """Job NAME's logs: every node's lines, each prefixed with its node (`[n0] ...`).

    As `launcher logs` on each node. The last lines are shown node by node in rank order;
    with -f every node is followed at once (one stream each) and new lines are shown as they
    come, until every node's run has ended; Ctrl-C stops following, never the runs (exit 0).
    Each node's outcome goes to stderr.

    \b
    Examples:
      launcher job logs train                 # the last 50 lines of every node
      launcher job logs --node n1 -n 200 train
      launcher job logs -f train              # follow every node
    Exit codes: 0 shown, 1 nothing to show on a node (no log, or no session with --raw),
    2 bad input, 3 a node unreachable (the others are still shown).
    """
    from launcher.commands import jobs as jobcommands
    from launcher.jobs.logs import JobLogsOptions
    from launcher.output.termsafe import sanitize

    inventory = app.inventory()

    def show(node_name: str, line: str) -> None:
        # The line is sanitised already (operate.logs); the node's name comes from the inventory.
        click.echo(f"[{node_name}] {line}")

    options = JobLogsOptions(node=node, tail=tail, raw=raw, follow=follow)
    result = jobcommands.logs(inventory, name, options, show)
    for outcome in result.nodes:
        if outcome.exit_code or follow:
            click.echo(sanitize(f"[{outcome.node}] {outcome.summary}", keep_sgr=False), err=True)
    sys.exit(int(result.exit_code))
