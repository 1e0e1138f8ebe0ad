"""`launcher verify` (the startup probe), `launcher status` (one poll) and `launcher smoke` (CI)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from launcher.cli.context import AppContext, fleet_options, pass_app
from launcher.commands.params import INTERVAL, SUCCESSES, WAIT, WINDOW, wait_lock_option

if TYPE_CHECKING:
    from launcher.config.models import Target
    from launcher.core.requests import SmokeRequest, StatusRequest, VerifyRequest
    from launcher.targets.fleet import Outcome


def _report_destination(_ctx: Any, _param: Any, path: Path | None) -> Path | None:
    """A report that could not be written is bad input: exit 2 before any connection."""
    from launcher.probe.htmlreport import destination_problem

    problem = destination_problem(path) if path is not None else None
    if problem:
        raise click.BadParameter(problem)
    return path


verbose_option = click.option(
    "-v",
    "--verbose",
    is_flag=True,
    help="Show every check with its expectation (default: the ones that did not pass).",
)


def probe_options(command: Any) -> Any:
    for option in reversed(
        [
            verbose_option,
            click.option(
                "--wait",
                type=WAIT,
                metavar="DURATION",
                help="Warmup: only fatal signs are judged; 90, 90s, 3m, 1h; up to 7 days "
                "(default: playbook verify.wait, itself 180 s by default).",
            ),
            click.option(
                "--interval",
                type=INTERVAL,
                metavar="DURATION",
                help="Time between polls: 2, 2s, 1m; 0.2 s to 1 h (default: playbook "
                "verify.interval, itself 10 s by default).",
            ),
            click.option(
                "--window",
                type=WINDOW,
                metavar="DURATION",
                help="How long after the warmup it may poll: 300, 5m; up to 7 days (default: "
                "playbook verify.window, itself 300 s by default).",
            ),
            click.option(
                "--successes",
                type=SUCCESSES,
                metavar="K",
                help="Consecutive passing polls needed (default: playbook verify.successes, "
                "itself 3 by default).",
            ),
            click.option(
                "--failure-threshold",
                type=SUCCESSES,
                metavar="N",
                help="Failing polls in a row that end the probe (default: playbook "
                "verify.failure_threshold).",
            ),
            click.option(
                "--json",
                "as_json",
                is_flag=True,
                help="Print the report as JSON (schema launcher.<command>/2); progress stays "
                "on stderr.",
            ),
            click.option(
                "--junit",
                type=click.Path(dir_okay=False, path_type=Path),
                help="Write a JUnit XML report here.",
            ),
            click.option(
                "--report",
                type=click.Path(dir_okay=False, writable=True, path_type=Path),
                callback=_report_destination,
                metavar="FILE.html",
                help="Write a self-contained HTML report here (charts, checks, last lines).",
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
    failure_threshold: int | None,
    as_json: bool,
    junit: Path | None,
    report: Path | None,
    verbose: bool,
) -> None:
    """Startup probe: fail fast on a crash, then judge queues, throughput, step and loss.

    Polls the run's tmux pane from the start; during the warmup only a dead pane, a gone
    session, a fatal sign the run did not survive or a restart ends the probe. After the
    warmup every poll is judged against the run's own history: K passing polls in a row make
    it healthy; a definite failure (loss not finite, throughput sagged from its peak, queues
    drained, a restart, ...) for N failing polls in a row (--failure-threshold) makes it
    unhealthy at once; a check that is only not passing yet waits for the window's end. The
    run the probe started on is pinned: a deploy that replaces it ends the probe (exit 1).

    \b
    Examples:
      launcher verify --wait 180 -t prod
      launcher verify --wait 20 --json --junit verify.xml -t staging
      launcher verify --all --wait 60          # a fleet, in parallel, one table
    Each poll is one progress line on stderr (a live line on a terminal; -q: none).
    Exit codes: 0 healthy, 1 unhealthy, 2 bad input, 3 unreachable, 130 interrupted;
    a fleet: the worst.
    """
    from launcher.commands.table import COMMANDS, probe_values

    values = probe_values(wait, interval, window, successes, failure_threshold)
    shown = {"json": as_json, "junit": junit, "report": report, "verbose": verbose}
    COMMANDS["verify"].run(app, {**values, **shown})


def run_verify(
    app: AppContext,
    request: VerifyRequest,
    *,
    json: bool,
    junit: str | Path | None,
    report: str | Path | None,
    verbose: bool,
) -> None:
    """The probe on the app's targets, its reports (also `launcher.tasks.verify`)."""
    from launcher.cli.targets import exit_with, run_on_targets
    from launcher.commands.table import work

    junit, report = _paths(junit, report)
    outcomes = run_on_targets(app, work(request), live=True)
    _report(app, outcomes, command="verify", as_json=json, junit=junit, verbose=verbose)
    _html_report(app, outcomes, report, "verify")
    exit_with(outcomes, title="verify", table=not json)


def _paths(junit: str | Path | None, report: str | Path | None) -> tuple[Path | None, Path | None]:
    """Report paths; an HTML report that could not be written: exit 2 before connecting."""
    from launcher.core.errors import UsageError
    from launcher.probe.htmlreport import destination_problem

    junit = Path(junit) if junit is not None else None
    report = Path(report) if report is not None else None
    problem = destination_problem(report) if report is not None else None
    if problem:
        raise UsageError(f"report={str(report)!r}: {problem}")
    return junit, report


@click.command("smoke")
@fleet_options
@probe_options
@wait_lock_option
@click.option(
    "--rollback-on-failure",
    is_flag=True,
    help="If the new run fails its probe, put the previous run back (code, env, checkpoints).",
)
@pass_app
def smoke_command(
    app: AppContext,
    wait_lock: float,
    rollback_on_failure: bool,
    wait: float | None,
    interval: float | None,
    window: float | None,
    successes: int | None,
    failure_threshold: int | None,
    as_json: bool,
    junit: Path | None,
    report: Path | None,
    verbose: bool,
) -> None:
    """CI smoke check: `deploy --restart`, then `verify`, with JUnit and JSON reports.

    Non-interactive; deploy steps and polls are progress lines on stderr (-q: none).
    Exit codes: 0 healthy, 1 unhealthy, 2 config, 3 unreachable, 4 refused (with
    --rollback-on-failure also: no run it could go back to), 5 rolled back and the previous
    run healthy again, 6 rolled back but not healthy, 7 the rollback failed, 130
    interrupted; a fleet: the highest (the one table).

    \b
    Example:
      launcher smoke -t staging --wait 60 --junit smoke.xml --report smoke.html --json > smoke.json
    """
    from launcher.commands.table import COMMANDS, probe_values

    probe = probe_values(wait, interval, window, successes, failure_threshold)
    values = {**probe, "wait_lock": wait_lock, "rollback_on_failure": rollback_on_failure}
    shown = {"json": as_json, "junit": junit, "report": report, "verbose": verbose}
    COMMANDS["smoke"].run(app, {**values, **shown})


def run_smoke(
    app: AppContext,
    request: SmokeRequest,
    *,
    json: bool,
    junit: str | Path | None,
    report: str | Path | None,
    verbose: bool,
) -> None:
    """Deploy, then the probe, on the app's targets (also `launcher.tasks.smoke`)."""
    from launcher.cli.targets import exit_with, run_on_targets
    from launcher.commands.table import work

    junit, report = _paths(junit, report)
    outcomes = run_on_targets(app, work(request))
    _report(app, outcomes, command="smoke", as_json=json, junit=junit, verbose=verbose)
    _html_report(app, outcomes, report, "smoke")
    exit_with(outcomes, title="smoke", table=not json)


@click.command("status")
@fleet_options
@click.option(
    "--json", "as_json", is_flag=True, help="Print the status as JSON (schema launcher.status/2)."
)
@verbose_option
@pass_app
def status_command(app: AppContext, as_json: bool, verbose: bool) -> None:
    """One poll of the run: session and pane, the latest sample, the checks, the deployed script.

    \b
    Examples:
      launcher status -t prod
      launcher status --all
    Exit codes: 0 healthy, 1 unhealthy (or no run), 2 bad input, 3 unreachable;
    a fleet: the worst.
    """
    from launcher.commands.table import COMMANDS

    app.say_inventory_from_env()
    COMMANDS["status"].run(app, {"json": as_json, "verbose": verbose})


def run_status(app: AppContext, request: StatusRequest, *, json: bool, verbose: bool) -> None:
    """One poll on the app's targets (also `launcher.tasks.status`)."""
    from launcher.cli.targets import exit_with, run_on_targets
    from launcher.commands.table import work

    outcomes = run_on_targets(app, work(request), quiet=True)
    if json or len(outcomes) == 1:
        _report(app, outcomes, command="status", as_json=json, junit=None, verbose=verbose)
    exit_with(outcomes, title="status", table=not json)


def _report(
    app: AppContext,
    outcomes: list[Outcome],
    *,
    command: str,
    as_json: bool,
    junit: Path | None,
    verbose: bool = False,
) -> None:
    from launcher.cli.targets import emit_json
    from launcher.output.ui import coloured_verdicts
    from launcher.probe.report import render_status, render_text, to_junit

    targets = {t.name: t for t in app.targets()}
    documents: list[dict[str, Any]] = []
    runs = []
    for outcome in outcomes:
        probe = outcome.data.get("probe")
        deploy = outcome.data.get("deploy")
        queues = _queues(targets[outcome.target])
        if probe is None:  # failed before probing (config error, deploy failed)
            documents.append(_failed_item(outcome, smoke=command == "smoke"))
            runs.append((outcome.target, None, deploy or outcome.data))
            if not as_json and deploy is None and outcome.error is None:
                click.echo(f"{outcome.target}: {outcome.summary}")
            continue
        if as_json:  # a summary of every sample: only for the JSON document
            documents.append(outcome.value.to_json())
        runs.append((outcome.target, probe, deploy))
        if not as_json and (len(outcomes) == 1 or outcome.exit_code):
            if "record" in outcome.data:
                text = render_status(outcome.target, probe, queues, outcome.data, verbose=verbose)
            else:
                text = render_text(outcome.target, probe, queues, verbose=verbose)
            click.echo(coloured_verdicts(text, sys.stdout))
    if junit:
        junit.write_text(to_junit(runs), encoding="utf-8")
    if as_json:
        emit_json(command, outcomes, documents)


def _failed_item(outcome: Outcome, *, smoke: bool) -> dict[str, Any]:
    """A target that was not probed: its error, or (smoke) the deploy that failed."""
    deploy = outcome.data.get("deploy")
    if smoke and deploy is not None:
        return {
            "target": outcome.target,
            "exit_code": int(outcome.exit_code),
            "deploy": deploy,
            "verify": None,
        }
    return {
        "target": outcome.target,
        "ok": False,
        "exit_code": int(outcome.exit_code),
        "error": outcome.error or outcome.summary,
    }


def _html_report(app: AppContext, outcomes: list[Outcome], path: Path | None, what: str) -> None:
    if path is None:
        return
    from launcher.probe.htmlreport import runs_from, write_report

    targets = app.targets()
    queues = {t.name: _queues(t) for t in targets}
    places = {t.name: (t.host_name, t.vmid) for t in targets}
    write_report(path, runs_from(outcomes, queues, places), f"launcher {what}")


def _queues(target: Target) -> list[str]:
    return list(target.playbook.spec.verify.queues)
