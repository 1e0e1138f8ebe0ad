"""`launcher watch`: judge runs for as long as they last; notify, restart, export metrics."""

from __future__ import annotations

import json
import signal
import sys
import threading
from collections.abc import Callable
from datetime import datetime
from types import FrameType
from typing import TYPE_CHECKING, Any

import click

from launcher.cli.context import AppContext, fleet_options, pass_app
from launcher.cli.declared import declared_options
from launcher.core.requests import WatchOptions

if TYPE_CHECKING:
    from launcher.watch.events import Event


@click.command("watch")
@fleet_options
@declared_options(WatchOptions)
@pass_app
def watch_command(app: AppContext, /, **values: Any) -> None:
    """Keep judging runs after startup; report only transitions.

    One poll per target per interval (one SSH connection per host), judged by the same checks
    as `verify`. Transitions (healthy → unhealthy, unhealthy → recovered, reachable ↔
    unreachable, a new run) go to stderr, to the state's events log and to every --webhook
    and --exec, once each, retried in the background. With --restart-on-failure an unhealthy
    run is redeployed with its checkpoints kept, at most --max-restarts times in
    --restart-window; then it is left stopped. Unreachable never causes a restart.

    \b
    Examples:
      launcher watch --all --webhook https://hooks.slack.com/services/...
      launcher watch -t prod --restart-on-failure --max-restarts 3 --metrics-port 9310
      launcher watch -t staging --for 10m --exec 'notify-send launcher'
    Exit codes (at --for's end): 1 a run unhealthy, failed, or left stopped after the last
    restart; else 3 one unreachable; else 0 (a finished run or one a person stopped included).
    SIGTERM ends it with 0, Ctrl-C with 130, bad input with 2.
    """
    from launcher.commands.args import build
    from launcher.config.models import inventory_path
    from launcher.watch.session import WatchSession, watch_request
    from launcher.watch.state import default_state_path

    given = build("watch", WatchOptions, values, api=False)
    request = watch_request(given, default_state_path(inventory_path(app.inventory_option)))
    targets = app.targets()  # a bad inventory exits 2 here, before any connection
    session = WatchSession(targets, request, _printer(given.as_json))

    def on_term(signum: int, frame: FrameType | None) -> None:
        session.stop()

    def started() -> None:
        names = ", ".join(t.name for t in targets)
        click.echo(f"watching {names} (state {request.state_path})", err=True)

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        result = session.run(started)
    finally:
        signal.signal(signal.SIGTERM, previous)
    raise SystemExit(result.exit_code)


def _printer(as_json: bool) -> Callable[[Event], None]:
    from launcher.output.termsafe import sanitize

    lock = threading.Lock()

    def say(event: Event) -> None:
        stamp = datetime.now().strftime("%H:%M:%S")
        lines = [f"{stamp} {event.target}: {sanitize(event.text, keep_sgr=False)}"]
        if event.kind in ("unhealthy", "gave_up"):
            lines += [f"    | {sanitize(line, keep_sgr=False)}" for line in event.last_lines]
        with lock:
            click.echo("\n".join(lines), err=True)
            if as_json and event.kind != "note":
                sys.stdout.write(json.dumps(event.to_json(), sort_keys=True) + "\n")
                sys.stdout.flush()

    return say
