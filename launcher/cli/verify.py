"""`launcher verify` (the startup probe), `launcher status` (one poll) and `launcher smoke` (CI)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from launcher.cli.main import AppContext, fleet_options, pass_app

if TYPE_CHECKING:
    from launcher.config import Target
    from launcher.fleet import Outcome


def probe_options(command: Any) -> Any:
    for option in reversed(
        [
            click.option(
                "--wait",
                type=float,
                metavar="SECONDS",
                help="Warmup: only fatal signs are judged (default: playbook verify.wait).",
            ),
            click.option(
                "--interval", type=float, metavar="SECONDS", help="Seconds between polls."
            ),
            click.option(
                "--window",
                type=float,
                metavar="SECONDS",
                help="How long after the warmup it may poll.",
            ),
            click.option(
                "--successes",
                type=click.IntRange(min=1),
                metavar="K",
                help="Consecutive passing polls needed.",
            ),
            click.option("--json", "as_json", is_flag=True, help="Print the report as JSON."),
            click.option(
                "--junit",
                type=click.Path(dir_okay=False, path_type=Path),
                help="Write a JUnit XML report here.",
            ),
        ]
    ):
        command = option(command)
    return command


@click.command("verify")
@fleet_options
@probe_options
@pass_app
def verify_command(
    app: AppContext,
    wait: float | None,
    interval: float | None,
    window: float | None,
    successes: int | None,
    as_json: bool,
    junit: Path | None,
) -> None:
    """Startup probe: fail fast on a crash, then judge queues, throughput, step and loss.

    Polls the run's tmux pane from the start; during the warmup only a dead pane, a gone
    session or a fail pattern (Traceback, CUDA out of memory, ...) ends the probe. After the
    warmup every poll is judged, and K passing polls in a row make it healthy.

    \b
    Examples:
      launcher verify --wait 180 -t prod
      launcher verify --wait 20 --json --junit verify.xml -t staging
      launcher verify --all --wait 60          # a fleet, in parallel, one table
    Exit codes: 0 healthy, 1 unhealthy, 3 unreachable, 2 bad input.
    """
    from launcher.cli.targets import exit_with, run_on_targets
    from launcher.probe import ProbeOverrides, verify_work

    overrides = ProbeOverrides(wait=wait, interval=interval, window=window, successes=successes)
    outcomes = run_on_targets(app, verify_work(overrides), quiet=as_json, live=True)
    _report(app, outcomes, as_json=as_json, junit=junit)
    exit_with(outcomes, title="verify", table=not as_json)


@click.command("smoke")
@fleet_options
@probe_options
@pass_app
def smoke_command(
    app: AppContext,
    wait: float | None,
    interval: float | None,
    window: float | None,
    successes: int | None,
    as_json: bool,
    junit: Path | None,
) -> None:
    """CI smoke check: `deploy --restart`, then `verify`, with JUnit and JSON reports.

    Non-interactive; the exit code comes from the one table (0 healthy, 1 unhealthy,
    2 config, 3 unreachable, 4 refused).

    \b
    Example:
      launcher smoke -t staging --wait 60 --junit smoke.xml --json > smoke.json
    """
    from launcher.cli.targets import exit_with, run_on_targets
    from launcher.probe import ProbeOverrides, smoke_work

    overrides = ProbeOverrides(wait=wait, interval=interval, window=window, successes=successes)
    outcomes = run_on_targets(app, smoke_work(overrides), quiet=as_json)
    _report(app, outcomes, as_json=as_json, junit=junit)
    exit_with(outcomes, title="smoke", table=not as_json)


@click.command("status")
@fleet_options
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON.")
@pass_app
def status_command(app: AppContext, as_json: bool) -> None:
    """One poll of the run: session and pane, the latest sample, the checks, the deployed script.

    \b
    Examples:
      launcher status -t prod
      launcher status --all
    """
    from launcher.cli.targets import exit_with, run_on_targets
    from launcher.probe import status_work

    outcomes = run_on_targets(app, status_work, quiet=True)
    if as_json or len(outcomes) == 1:
        _report(app, outcomes, as_json=as_json, junit=None)
    exit_with(outcomes, title="status", table=not as_json)


def _report(app: AppContext, outcomes: list[Outcome], *, as_json: bool, junit: Path | None) -> None:
    from launcher.report import render_status, render_text, to_json, to_junit

    targets = {t.name: t for t in app.targets()}
    documents: list[dict[str, Any]] = []
    runs = []
    for outcome in outcomes:
        probe = outcome.data.get("probe")
        deploy = outcome.data.get("deploy")
        queues = _queues(targets[outcome.target])
        if probe is None:  # failed before probing (config error, deploy failed)
            documents.append({"target": outcome.target, "deploy": deploy, **outcome.data})
            runs.append((outcome.target, None, deploy or outcome.data))
            if not as_json and deploy is None:
                click.echo(f"{outcome.target}: {outcome.summary}")
            continue
        document = to_json(outcome.target, probe, queues)
        if "record" in outcome.data:
            document["deployed"] = outcome.data.get("record")
            document["log_age"] = outcome.data.get("log_age")
        if deploy is not None:
            document = {"target": outcome.target, "deploy": deploy, "verify": document}
        documents.append(document)
        runs.append((outcome.target, probe, deploy))
        if not as_json and (len(outcomes) == 1 or outcome.exit_code):
            if "record" in outcome.data:
                click.echo(render_status(outcome.target, probe, queues, outcome.data))
            else:
                click.echo(render_text(outcome.target, probe, queues))
    if junit:
        junit.write_text(to_junit(runs), encoding="utf-8")
    if as_json:
        click.echo(json.dumps(documents[0] if len(documents) == 1 else documents, indent=2))


def _queues(target: Target) -> list[str]:
    return list(target.playbook.spec.verify.queues)
