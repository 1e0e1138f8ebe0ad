"""`launcher watch`: judge runs for as long as they last; notify, restart, export metrics."""

from __future__ import annotations

import json
import signal
import sys
import threading
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

import click

from launcher.cli.context import AppContext, fleet_options, pass_app
from launcher.core.params import (
    HOUR,
    INTERVAL,
    MAX_RESTARTS,
    PORT,
    RESTART_BACKOFF,
    RESTART_WINDOW,
    WAIT,
    WATCH_FOR,
)

if TYPE_CHECKING:
    from launcher.watch.events import Event


@click.command("watch")
@fleet_options
@click.option(
    "--interval",
    type=INTERVAL,
    metavar="SECONDS",
    help="Time between polls of a target (default: playbook verify.interval).",
)
@click.option(
    "--wait",
    type=WAIT,
    metavar="SECONDS",
    help="Warmup of a new run: only a crash, a fatal sign or a restart counts "
    "(default: playbook verify.wait).",
)
@click.option(
    "--for",
    "duration",
    type=WATCH_FOR,
    metavar="DURATION",
    help="End after this long: 90, 10m, 2h.",
)
@click.option(
    "--webhook",
    "webhooks",
    multiple=True,
    metavar="URL",
    help="POST each event as JSON (schema launcher.watch.event/1, Slack-compatible `text`). "
    "Repeatable.",
)
@click.option(
    "--exec",
    "commands",
    multiple=True,
    metavar="CMD",
    help="Run CMD (split like a shell would, run without one) for each event, with the event "
    "in LAUNCHER_EVENT_* variables. Repeatable.",
)
@click.option(
    "--restart-on-failure",
    is_flag=True,
    help="Redeploy a run that crashed or hung, with its checkpoints kept (it resumes).",
)
@click.option(
    "--max-restarts",
    type=MAX_RESTARTS,
    default=3,
    show_default=True,
    metavar="N",
    help="At most N restarts per target in --restart-window; then the run is left stopped.",
)
@click.option(
    "--restart-window",
    type=RESTART_WINDOW,
    default=HOUR,
    metavar="DURATION",
    help="The sliding window --max-restarts counts in (default 1h).",
)
@click.option(
    "--restart-backoff",
    type=RESTART_BACKOFF,
    default=10.0,
    metavar="DURATION",
    help="Wait before the first restart in a window, doubled for each further one (default 10s).",
)
@click.option(
    "--metrics-port",
    type=PORT,
    metavar="PORT",
    help="Serve Prometheus metrics on this port.",
)
@click.option(
    "--metrics-address",
    default="127.0.0.1",
    show_default=True,
    metavar="ADDR",
    help="Address the metrics server binds to.",
)
@click.option(
    "--state",
    "state_file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="State file (default: one per inventory under $XDG_STATE_HOME/launcher/watch/).",
)
@click.option("--json", "as_json", is_flag=True, help="Also print each event as JSON on stdout.")
@pass_app
def watch_command(
    app: AppContext,
    interval: float | None,
    wait: float | None,
    duration: float | None,
    webhooks: tuple[str, ...],
    commands: tuple[str, ...],
    restart_on_failure: bool,
    max_restarts: int,
    restart_window: float,
    restart_backoff: float,
    metrics_port: int | None,
    metrics_address: str,
    state_file: Path | None,
    as_json: bool,
) -> None:
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
    from launcher.config.models import inventory_path
    from launcher.watch.monitor import WatchSettings
    from launcher.watch.policy import RestartPolicy
    from launcher.watch.session import WatchRequest, WatchSession
    from launcher.watch.state import default_state_path

    request = WatchRequest(
        state_path=state_file or default_state_path(inventory_path(app.inventory_option)),
        settings=WatchSettings(
            interval=interval,
            wait=wait,
            restart=restart_on_failure,
            policy=RestartPolicy(max_restarts, restart_window, restart_backoff),
        ),
        duration=duration,
        webhooks=webhooks,
        commands=commands,
        metrics_port=metrics_port,
        metrics_address=metrics_address,
    )
    targets = app.targets()  # a bad inventory exits 2 here, before any connection
    session = WatchSession(targets, request, _printer(as_json))

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
