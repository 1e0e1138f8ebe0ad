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
from launcher.cli.params import DAY, HOUR, INTERVAL, WAIT, Count, Duration

if TYPE_CHECKING:
    from launcher.watch.events import Event

FOR = Duration(0, 365 * DAY)
RESTART_WINDOW = Duration(1, 30 * DAY)
BACKOFF = Duration(0, HOUR)
MAX_RESTARTS = Count(0, 1000)
PORT = Count(1, 65535)
# What a shutdown gives the notifier to deliver what is due (the rest stays in the outbox).
DRAIN_SECONDS = 5.0


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
    "--for", "duration", type=FOR, metavar="DURATION", help="End after this long: 90, 10m, 2h."
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
    type=BACKOFF,
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
    from launcher.config import inventory_path
    from launcher.errors import ExitCode, UsageError
    from launcher.fleet import connections_for
    from launcher.watch.metrics import Metrics
    from launcher.watch.monitor import Hub, Watcher, WatchSettings
    from launcher.watch.notify import (
        Deliver,
        Notifier,
        command,
        parse_exec,
        parse_webhook,
        webhook,
        webhook_name,
    )
    from launcher.watch.policy import RestartPolicy
    from launcher.watch.state import WatchState, default_state_path

    destinations: dict[str, Deliver] = {}
    for url in webhooks:
        destinations[webhook_name(parse_webhook(url))] = webhook(url)
    for text in commands:
        destinations[f"exec {text}"] = command(parse_exec(text))
    targets = app.targets()  # a bad inventory exits 2 here, before any connection
    path = state_file or default_state_path(inventory_path(app.inventory_option))
    state = WatchState(path).open()
    notifier = Notifier(destinations, state) if destinations else None
    metrics = Metrics() if metrics_port else None
    settings = WatchSettings(
        interval=interval,
        wait=wait,
        restart=restart_on_failure,
        policy=RestartPolicy(max_restarts, restart_window, restart_backoff),
    )
    say = _printer(as_json)
    with connections_for(targets) as connection:
        hub = Hub(state, notifier, metrics, say)
        watcher = Watcher(targets, settings, hub, connection)
        terminated = threading.Event()

        def on_term(signum: int, frame: FrameType | None) -> None:
            terminated.set()
            watcher.stop()

        try:
            if metrics is not None and metrics_port is not None:
                try:
                    metrics.serve(metrics_port, metrics_address)
                except OSError as exc:
                    raise UsageError(
                        f"--metrics-port {metrics_port}: cannot listen on "
                        f"{metrics_address}:{metrics_port}: {exc.strerror or exc}"
                    ) from None
            if notifier is not None:
                notifier.start()
            previous = signal.signal(signal.SIGTERM, on_term)
            names = ", ".join(t.name for t in targets)
            click.echo(f"watching {names} (state {path})", err=True)
            try:
                watcher.run(duration)
            finally:
                signal.signal(signal.SIGTERM, previous)
        finally:
            watcher.stop()
            if notifier is not None:
                notifier.stop(DRAIN_SECONDS)
            if metrics is not None:
                metrics.close()
            state.close()
    if terminated.is_set():
        raise SystemExit(int(ExitCode.OK))
    raise SystemExit(int(_final_code(watcher)))


def _final_code(watcher: object) -> int:
    from launcher.errors import ExitCode
    from launcher.watch.monitor import Watcher

    assert isinstance(watcher, Watcher)
    records = watcher.statuses().values()
    # A run left down: unhealthy, failed, stopped by the watcher after its last restart, or one
    # that went bad during the watch and never came back healthy (a crash loop restarted again
    # and again, by launcher or by the trainer's own launcher). A finished run (exit 0) and one a
    # person stopped are not failures.
    down = ("unhealthy", "failed", "restarting")
    if any(
        r.status in down or r.bad or (r.status == "stopped" and r.gave_up_run == r.run)
        for r in records
    ):
        return int(ExitCode.UNHEALTHY)
    if any(not r.reachable for r in records) or watcher.errors:
        return int(ExitCode.UNREACHABLE)
    return int(ExitCode.OK)


def _printer(as_json: bool) -> Callable[[Event], None]:
    from launcher.termsafe import sanitize

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
