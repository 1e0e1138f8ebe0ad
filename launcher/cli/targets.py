"""Running a command's per-target work on one target or a fleet, and ending it.

Progress (steps, polls) always goes to stderr: live on a terminal, one plain line each
elsewhere; -q silences it. stdout gets only the result: text, a fleet's table, or --json.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import click

from launcher.cli.context import AppContext, print_error
from launcher.core.errors import LauncherError
from launcher.targets.fleet import FleetResult, Outcome, Work, error_outcome, run_fleet, run_one


def run_on_targets(
    app: AppContext, work: Work, *, quiet: bool = False, live: bool = False
) -> list[Outcome]:
    """One target: run in this thread, its error printed once on stderr (with its hint).
    Several: in parallel, with progress per target (the caller prints the closing table).
    `live`: the progress is polls (one updating line on a terminal), not steps to keep."""
    from launcher.output.ui import FleetDisplay, LiveLine, progress_line

    targets = app.targets()
    silent = quiet or app.quiet
    if len(targets) == 1:
        target = targets[0]
        with LiveLine(enabled=live and not silent) as line:
            say: Callable[[str], None] = (
                (lambda text: None) if silent else line.say if live else progress_line
            )
            try:
                return [run_one(target, work, say=say)]
            except LauncherError as error:
                print_error(error, debug=app.debug)
                return [error_outcome(target.name, error)]
    with FleetDisplay([t.name for t in targets], enabled=not silent) as display:
        # A target's error is shown once: in its row of the table (or its --json item).
        return run_fleet(targets, work, parallel=app.parallel, say=display.say)


@contextmanager
def result_output() -> Iterator[None]:
    """The result is printed once the work is done: a reader gone by then (`launcher deploy |
    true`) drops it, and the command's own exit code stands; nothing was cut short, so not
    141 (which a reader that ends a stream, `launcher logs -f | head`, still gives)."""
    try:
        yield
    except BrokenPipeError:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())  # what is still buffered goes nowhere, quietly
        os.close(null)


def say_result(outcomes: Sequence[Outcome]) -> None:
    """One target's summary on stdout, unless it is the error already printed on stderr."""
    from launcher.output.termsafe import sanitize

    if len(outcomes) == 1 and outcomes[0].error is None:
        with result_output():
            click.echo(sanitize(outcomes[0].summary, keep_sgr=False))


def emit_json(
    command: str, outcomes: Sequence[Outcome], items: Sequence[dict[str, Any]] | None = None
) -> None:
    """The command's envelope (launcher/output/jsonout.py) on stdout; `items`: each target's item,
    when not its result's own JSON form."""
    from launcher.output.jsonout import emit

    with result_output():
        emit(FleetResult(command, list(outcomes)).to_json(items))


def exit_with(outcomes: Sequence[Outcome], *, title: str, table: bool = True) -> None:
    """End a command: the closing table for a fleet (last, after any details), the job summary
    and annotations under GitHub Actions, then the code."""
    from launcher.probe import ci

    result = FleetResult(title, list(outcomes))
    if table and len(outcomes) > 1:
        with result_output():
            click.echo(result.summary)
    ci.report(title, outcomes)
    raise SystemExit(int(result.exit_code))
