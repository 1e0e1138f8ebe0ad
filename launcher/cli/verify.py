"""`launcher verify` (the startup probe), `launcher status` (one poll) and `launcher smoke` (CI)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from launcher.cli.context import AppContext
from launcher.cli.declared import Show, declared
from launcher.cli.targets import emit_json, exit_with, run_on_targets
from launcher.commands.table import COMMANDS, Command, work

if TYPE_CHECKING:
    from launcher.config.models import Target
    from launcher.core.requests import SmokeRequest, StatusRequest, VerifyRequest
    from launcher.targets.fleet import Outcome


def show_probe(name: str, *, live: bool) -> Show:
    """`verify` (the probe) or `smoke` (deploy, then the probe) on the app's targets, with
    their reports; `live`: the polls as one updating line."""

    def show(app: AppContext, request: VerifyRequest | SmokeRequest, command: Command) -> None:
        junit, report = _paths(request.junit, request.report)
        outcomes = run_on_targets(app, work(request), live=live)
        _report(app, outcomes, command=name, request=request, junit=junit)
        _html_report(app, outcomes, report, name)
        exit_with(outcomes, title=name, table=not request.json)

    return show


verify_command = declared(COMMANDS["verify"], show_probe("verify", live=True))


def _paths(junit: str | Path | None, report: str | Path | None) -> tuple[Path | None, Path | None]:
    """Report paths; an HTML report that could not be written: exit 2 before connecting."""
    from launcher.core.errors import UsageError
    from launcher.probe.htmlreport import destination_problem

    junit = Path(junit) if junit is not None else None
    report = Path(report) if report is not None else None
    problem = destination_problem(report) if report is not None else None
    if problem:
        raise UsageError(f"--report {str(report)!r}: {problem}")
    return junit, report


smoke_command = declared(COMMANDS["smoke"], show_probe("smoke", live=False))


def show_status(app: AppContext, request: StatusRequest, command: Command) -> None:
    """One poll on the app's targets."""
    app.say_inventory_from_env()
    outcomes = run_on_targets(app, work(request), quiet=True)
    if request.json or len(outcomes) == 1:
        _report(app, outcomes, command="status", request=request, junit=None)
    exit_with(outcomes, title="status", table=not request.json)


status_command = declared(COMMANDS["status"], show_status)


def _report(
    app: AppContext,
    outcomes: list[Outcome],
    *,
    command: str,
    request: VerifyRequest | SmokeRequest | StatusRequest,
    junit: Path | None,
) -> None:
    from launcher.output.ui import coloured_verdicts
    from launcher.probe.report import render_status, render_text, to_junit

    as_json, verbose = request.json, request.verbose
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
