"""`launcher verify` (the startup probe) and `launcher status` (one poll, no waiting)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from launcher.cli.main import AppContext, pass_app


@click.command("verify")
@click.option(
    "--wait",
    type=float,
    metavar="SECONDS",
    help="Warmup: only fatal signs are judged (default: playbook verify.wait).",
)
@click.option(
    "--interval", type=float, metavar="SECONDS", help="Seconds between polls (default: playbook)."
)
@click.option(
    "--window", type=float, metavar="SECONDS", help="How long after the warmup it may keep polling."
)
@click.option(
    "--successes", type=click.IntRange(min=1), metavar="K", help="Consecutive passing polls needed."
)
@click.option(
    "--json", "as_json", is_flag=True, help="Print the report as JSON (schema launcher.verify/1)."
)
@click.option(
    "--junit",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write a JUnit XML report here.",
)
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
    Exit codes: 0 healthy, 1 unhealthy, 3 unreachable, 2 bad input.
    """
    from launcher.probe import ProbeOverrides, probe_target
    from launcher.report import render_text, to_json, to_junit

    target = app.target()
    overrides = ProbeOverrides(wait=wait, interval=interval, window=window, successes=successes)
    probe = probe_target(target, overrides, live=not as_json)
    queues = list(target.playbook.spec.verify.queues)
    if junit:
        junit.write_text(to_junit(target.name, probe), encoding="utf-8")
    if as_json:
        click.echo(json.dumps(to_json(target.name, probe, queues), indent=2))
    else:
        click.echo(render_text(target.name, probe, queues))
    sys.exit(int(probe.exit_code))


@click.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON.")
@pass_app
def status_command(app: AppContext, as_json: bool) -> None:
    """One poll of the run: session and pane state, the latest sample and the checks.

    \b
    Example:
      launcher status -t prod
    """
    from launcher.probe import status_once
    from launcher.report import render_text, to_json

    target = app.target()
    probe = status_once(target)
    queues = list(target.playbook.spec.verify.queues)
    if as_json:
        click.echo(json.dumps(to_json(target.name, probe, queues), indent=2))
    else:
        click.echo(render_text(target.name, probe, queues))
    sys.exit(int(probe.exit_code))
