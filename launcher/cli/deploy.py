"""`launcher deploy`: verified upload, real stop of the old run, checkpoints set aside, launch."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from launcher.cli.context import AppContext, fleet_options, pass_app
from launcher.commands.params import GRACE, wait_lock_option

if TYPE_CHECKING:
    from launcher.deploy.deploy import DeployOptions


@click.command("deploy")
@fleet_options
@click.option("--restart", is_flag=True, help="Stop the running session first (C-c, wait, kill).")
@click.option("--dry-run", is_flag=True, help="Print every step it would take; change nothing.")
@click.option(
    "--grace",
    type=GRACE,
    metavar="DURATION",
    help="Wait this long after C-c: 90, 90s, 2m; 0 s to 1 h (default: playbook stop_grace).",
)
@click.option(
    "--purge-checkpoints", "purge", is_flag=True, help="Delete old checkpoints, not archive them."
)
@click.option(
    "--keep-checkpoints", "keep", is_flag=True, help="Leave checkpoints in place (for a resume)."
)
@click.option(
    "--kill-gpu-holders",
    is_flag=True,
    help="Kill processes outside the old run that hold the GPUs (default: refuse, exit 4).",
)
@click.option(
    "--prune-archives",
    is_flag=True,
    help="Beyond the playbook's keep_archives, prune also archives of runs that lived longer "
    "or hold more checkpoints than the runs kept (default: those are kept).",
)
@wait_lock_option
@click.option(
    "--env",
    "env",
    multiple=True,
    metavar="KEY=VALUE",
    help="Set an environment value for this deploy (repeatable; history records the name).",
)
@click.option(
    "--set",
    "sets",
    multiple=True,
    metavar="KEY=VALUE",
    help="Override a playbook key for this deploy, e.g. verify.wait=60 (repeatable).",
)
@click.option("--command", "command", help="Run this command instead of the playbook's.")
@click.option("--message", "-m", help="Why: recorded in history with the deploy.")
@click.option("--diff", is_flag=True, help="With a project: show text diffs of changed files.")
@click.option(
    "--verify", is_flag=True, help="Then run the startup probe on the new run (exit 1 unhealthy)."
)
@click.option(
    "--rollback-on-failure",
    is_flag=True,
    help="If the new run fails its probe, put the previous run back (code, env, checkpoints).",
)
@click.option(
    "--json", "as_json", is_flag=True, help="Print the report as JSON (schema launcher.deploy/1)."
)
@pass_app
def deploy_command(
    app: AppContext,
    restart: bool,
    dry_run: bool,
    grace: float | None,
    purge: bool,
    keep: bool,
    kill_gpu_holders: bool,
    prune_archives: bool,
    wait_lock: float,
    env: tuple[str, ...],
    sets: tuple[str, ...],
    command: str | None,
    message: str | None,
    diff: bool,
    verify: bool,
    rollback_on_failure: bool,
    as_json: bool,
) -> None:
    """Upload the script (verified), stop the old run, set checkpoints aside, launch in tmux.

    \b
    Examples:
      launcher deploy -t staging              # first launch; refuses if a run is active
      launcher deploy --restart -t prod       # replace the running job
      launcher deploy --restart --dry-run     # show the plan, change nothing
      launcher deploy --restart --all         # every target, in parallel, one table
      launcher deploy --restart --wait-lock 10m   # CI: queue behind a deploy in progress
      launcher deploy --restart --verify --rollback-on-failure   # the last good run back if not
    Steps go to stderr as they happen (-q: none); the result or --json to stdout.
    Exit codes: 0 deployed (or planned; with --verify: and healthy), 1 (--verify) unhealthy,
    2 bad input, 3 unreachable or a step failed, 4 refused (lock held, run active, GPUs busy;
    with --rollback-on-failure: no run it could go back to), 5 rolled back and the previous
    run healthy again, 6 rolled back but not healthy, 7 the rollback failed, 130 interrupted;
    a fleet: the highest.
    """
    from launcher.commands.table import COMMANDS
    from launcher.core.errors import UsageError

    if purge and keep:
        raise UsageError("--purge-checkpoints and --keep-checkpoints exclude each other")
    values = {
        "restart": restart,
        "dry_run": dry_run,
        "checkpoints": "purge" if purge else "keep" if keep else "archive",
        "grace": grace,
        "kill_gpu_holders": kill_gpu_holders,
        "prune_archives": prune_archives,
        "wait_lock": wait_lock,
        "env": env,
        "sets": sets,
        "command": command,
        "message": message,
        "diff": diff,
        "verify": verify,
        "rollback_on_failure": rollback_on_failure,
    }
    app.say_inventory_from_env()
    run_deploy(app, COMMANDS["deploy"].request(values), json=as_json)


def run_deploy(app: AppContext, options: DeployOptions, *, json: bool) -> None:
    """Deploy on the app's targets and show the result (also `launcher.tasks.deploy`)."""
    from launcher.cli.targets import emit_json, exit_with, run_on_targets, say_result
    from launcher.commands.table import work

    outcomes = run_on_targets(app, work(options))
    if json:
        emit_json("deploy", outcomes)
    else:
        say_result(outcomes)
    exit_with(outcomes, title="deploy", table=not json)
