"""`launcher deploy`: verified upload, real stop of the old run, checkpoints set aside, launch."""

from __future__ import annotations

import json

import click

from launcher.cli.main import AppContext, fleet_options, pass_app


@click.command("deploy")
@fleet_options
@click.option("--restart", is_flag=True, help="Stop the running session first (C-c, wait, kill).")
@click.option("--dry-run", is_flag=True, help="Print every step it would take; change nothing.")
@click.option(
    "--grace", type=float, metavar="SECONDS", help="Wait this long after C-c (default: playbook)."
)
@click.option(
    "--purge-checkpoints", "purge", is_flag=True, help="Delete old checkpoints, not archive them."
)
@click.option(
    "--keep-checkpoints", "keep", is_flag=True, help="Leave checkpoints in place (for a resume)."
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@pass_app
def deploy_command(
    app: AppContext,
    restart: bool,
    dry_run: bool,
    grace: float | None,
    purge: bool,
    keep: bool,
    as_json: bool,
) -> None:
    """Upload the script (verified), stop the old run, set checkpoints aside, launch in tmux.

    \b
    Examples:
      launcher deploy -t staging              # first launch; refuses if a run is active
      launcher deploy --restart -t prod       # replace the running job
      launcher deploy --restart --dry-run     # show the plan, change nothing
      launcher deploy --restart --all         # every target, in parallel, one table
    """
    from launcher.cli.targets import exit_with, run_on_targets
    from launcher.deploy import DeployOptions, deploy_work
    from launcher.errors import UsageError

    if purge and keep:
        raise UsageError("--purge-checkpoints and --keep-checkpoints exclude each other")
    options = DeployOptions(
        restart=restart,
        dry_run=dry_run,
        checkpoint_mode="purge" if purge else "keep" if keep else "archive",
        grace=grace,
    )
    outcomes = run_on_targets(app, deploy_work(options), quiet=as_json)
    if as_json:
        reports = [o.data for o in outcomes]
        click.echo(json.dumps(reports[0] if len(reports) == 1 else reports, indent=2))
    elif len(outcomes) == 1:
        click.echo(outcomes[0].summary)
    exit_with(outcomes, title="deploy", table=not as_json)
