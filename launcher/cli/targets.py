"""Running a command's per-target work on one target (plain output) or on a fleet (one table)."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import click

from launcher.cli.main import AppContext, print_error
from launcher.errors import ExitCode, LauncherError
from launcher.fleet import (
    FleetContext,
    Outcome,
    Work,
    error_outcome,
    render_table,
    run_fleet,
    worst,
)


def run_on_targets(
    app: AppContext, work: Work, *, quiet: bool = False, live: bool = False
) -> list[Outcome]:
    """One target: run in this thread, errors propagate (with their hints) as usual.
    Several: in parallel, with progress per target (the caller prints the closing table)."""
    from launcher.remote import ConnectionPool
    from launcher.ui import FleetDisplay, LiveLine, echo_line

    targets = app.targets()
    if len(targets) == 1:
        target = targets[0]
        with ConnectionPool() as pool, LiveLine(enabled=live and not quiet) as line:
            say = line.say if live else (lambda text: None) if quiet else echo_line
            conn = pool.get(target.host_name, target.host)
            try:
                return [work(FleetContext(target, conn, threading.Event(), say))]
            except LauncherError as error:
                print_error(error, debug=app.debug)
                return [error_outcome(target.name, error)]
    with FleetDisplay([t.name for t in targets], enabled=not quiet) as display:
        return run_fleet(targets, work, parallel=app.parallel, say=display.say)


def exit_with(outcomes: Sequence[Outcome], *, title: str, table: bool = True) -> None:
    """End a command: the closing table for a fleet (last, after any details), then the code."""
    if table and len(outcomes) > 1:
        click.echo(render_table(outcomes, title=title))
    raise SystemExit(int(worst([o.exit_code for o in outcomes]) if outcomes else ExitCode.OK))
