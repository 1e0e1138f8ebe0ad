"""`launcher deploy`: verified upload, real stop of the old run, checkpoints set aside, launch."""

from __future__ import annotations

import json

import click

from launcher.cli.main import AppContext, pass_app


@click.command("deploy")
@click.option("--restart", is_flag=True, help="Stop the running session first (C-c, wait, kill).")
@click.option("--dry-run", is_flag=True, help="Print every step it would take; change nothing.")
@click.option(
    "--grace",
    type=float,
    metavar="SECONDS",
    help="Wait this long after C-c (default: playbook stop_grace).",
)
@click.option(
    "--purge-checkpoints",
    "purge",
    is_flag=True,
    help="Delete old checkpoints instead of archiving them.",
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
    """
    from launcher.deploy import DeployOptions, deploy
    from launcher.errors import LauncherError, UsageError
    from launcher.remote import ConnectionPool
    from launcher.ui import echo_step

    if purge and keep:
        raise UsageError("--purge-checkpoints and --keep-checkpoints exclude each other")
    target = app.target()
    options = DeployOptions(
        restart=restart,
        dry_run=dry_run,
        checkpoint_mode="purge" if purge else "keep" if keep else "archive",
        grace=grace,
    )

    def show(step: object) -> None:
        if not as_json:
            echo_step(step.name, step.status, step.detail)  # type: ignore[attr-defined]

    with ConnectionPool() as pool:
        conn = pool.get(target.host_name, target.host)
        try:
            report = deploy(target, conn, options, on_step=show)
        except LauncherError as error:
            if as_json:
                click.echo(
                    json.dumps(
                        {
                            "target": target.name,
                            "ok": False,
                            "exit_code": int(error.exit_code),
                            "error": error.message,
                        }
                    )
                )
            raise
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=2))
    elif dry_run:
        click.echo(f"dry run: nothing was changed on {target.label}")
    else:
        click.echo(f"deployed {target.label}: sha256 {report.sha256[:12]}")
