"""One watch from start to end, for the CLI and the API alike, of targets or of a job.

The state file, the notifier, the metrics server and what is watched (one connection per host)
are opened in that order and closed in reverse whatever ends the watch (its duration, `stop()`
from a signal handler or another thread, an error); the exit code is judged from what each
target was left in.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from launcher.config.models import Target
from launcher.core.errors import ExitCode, UsageError
from launcher.core.jobrequests import JobWatchRequest
from launcher.core.requests import WatchOptions
from launcher.watch.events import Event
from launcher.watch.metrics import Metrics
from launcher.watch.monitor import Hub, Subject, Watcher, WatchSettings
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
from launcher.watch.state import TargetRecord, WatchState
from launcher.watch.target import target_subjects

# What a shutdown gives the notifier to deliver what is due (the rest stays in the outbox).
DRAIN_SECONDS = 5.0
# Statuses that leave a run down when the watch ends (see final_code).
DOWN = ("unhealthy", "failed", "restarting")


def receivers(webhooks: Sequence[str], commands: Sequence[str]) -> dict[str, Deliver]:
    """--webhook URLs and --exec command lines as the notifier's receivers, by name; a bad one
    is a UsageError (exit 2), raised before anything is opened."""
    found: dict[str, Deliver] = {}
    for url in webhooks:
        found[webhook_name(parse_webhook(url))] = webhook(url)
    for text in commands:
        found[f"exec {text}"] = command(parse_exec(text))
    return found


@dataclass(frozen=True)
class WatchRequest:
    """What to watch with; the targets come separately (they are resolved from an inventory)."""

    state_path: Path
    settings: WatchSettings = field(default_factory=WatchSettings)
    duration: float | None = None  # None: until stop()
    webhooks: tuple[str, ...] = ()
    commands: tuple[str, ...] = ()
    metrics_port: int | None = None
    metrics_address: str = "127.0.0.1"

    # --webhook and --exec as the notifier's receivers, made with the request: a bad one is
    # refused here, before the inventory is read or anything is opened.
    receivers: dict[str, Deliver] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "receivers", receivers(self.webhooks, self.commands))


def watch_request(options: WatchOptions | JobWatchRequest, default_state: Path) -> WatchRequest:
    """The watch a target's options (`launcher watch`, `Launcher.watch`) or a job's request
    (`launcher job watch`) ask for; a job's poll has no warmup of its own (`wait`)."""
    return WatchRequest(
        state_path=Path(options.state) if options.state else default_state,
        settings=WatchSettings(
            interval=options.interval,
            wait=options.wait if isinstance(options, WatchOptions) else None,
            restart=options.restart_on_failure,
            policy=RestartPolicy(
                options.max_restarts, options.restart_window, options.restart_backoff
            ),
        ),
        duration=options.duration,
        webhooks=options.webhooks,
        commands=options.commands,
        metrics_port=options.metrics_port,
        metrics_address=options.metrics_address,
    )


@dataclass(frozen=True)
class WatchResult:
    """How a watch ended: its exit code, what each target was left in, and its own errors."""

    exit_code: int
    statuses: dict[str, TargetRecord]
    errors: tuple[str, ...] = ()
    stopped: bool = False  # ended by stop() (SIGTERM), not by its duration

    @property
    def summary(self) -> str:
        states = ", ".join(f"{name} {record.status}" for name, record in self.statuses.items())
        ended = "stopped" if self.stopped else "ended"
        return f"watch {ended}: {states or 'no target watched'} (exit {self.exit_code})"

    def to_json(self) -> dict[str, Any]:
        return {
            "exit_code": self.exit_code,
            "stopped": self.stopped,
            "errors": list(self.errors),
            "targets": {
                name: {
                    "status": record.status,
                    "run": record.run,
                    "reachable": record.reachable,
                    "restarts": len(record.restarts),
                }
                for name, record in self.statuses.items()
            },
        }


def final_code(statuses: Mapping[str, TargetRecord], errors: Sequence[str]) -> int:
    """The exit code at the watch's end. A run left down: unhealthy, failed, stopped by the
    watcher after its last restart, or one that went bad during the watch and never came back
    healthy (a crash loop restarted again and again, by launcher or by the trainer's own
    launcher). A finished run (exit 0) and one a person stopped are not failures."""
    records = statuses.values()
    if any(
        r.status in DOWN or r.bad or (r.status == "stopped" and r.gave_up_run == r.run)
        for r in records
    ):
        return int(ExitCode.UNHEALTHY)
    if any(not r.reachable for r in records) or errors:
        return int(ExitCode.UNREACHABLE)
    return int(ExitCode.OK)


def guarded(
    sink: Callable[[Event], None], report: Callable[[str], None]
) -> Callable[[Event], None]:
    """`sink` (an API caller's callback) made harmless to the watch: what it raises is reported
    and the event goes on to the notifier, so a bug in a callback silences no webhook."""

    def deliver(event: Event) -> None:
        try:
            sink(event)
        except Exception as exc:
            report(f"{event.target}: on_event raised {type(exc).__name__}: {exc}")

    return deliver


class WatchSession:
    """A watch of `targets`: `run()` blocks until it ends; `stop()` ends it (exit code 0)."""

    def __init__(
        self, targets: Sequence[Target], request: WatchRequest, say: Callable[[Event], None]
    ) -> None:
        self.targets = list(targets)
        self.request = request
        self.say = say
        self._stopped = threading.Event()

    def stop(self) -> None:
        """End the watch; safe from a signal handler and from another thread, and before run()
        (which then returns at once)."""
        self._stopped.set()

    def run(self, started: Callable[[], None] = lambda: None) -> WatchResult:
        """Watch until the request's duration passes or stop() is called; `started` is called
        once the metrics server listens and the notifier runs, just before the first polls."""
        subjects = target_subjects(self.targets, self.request.settings)
        return run_watch(subjects, self.request, self.say, self._stopped, started)


def run_watch(
    subjects: AbstractContextManager[Sequence[Subject]],
    request: WatchRequest,
    say: Callable[[Event], None],
    stop: threading.Event,
    started: Callable[[], None] = lambda: None,
) -> WatchResult:
    """One watch of what `subjects` opens (targets, or a job), until the request's duration
    passes or `stop` is set: the state file, the notifier, the metrics server and the subjects
    opened in that order and closed in reverse."""
    state = WatchState(request.state_path).open()
    notifier = Notifier(request.receivers, state) if request.receivers else None
    metrics = Metrics() if request.metrics_port else None
    try:
        with subjects as watched:
            watcher = Watcher(watched, request.settings, Hub(state, notifier, metrics, say))
            try:
                if metrics is not None and request.metrics_port is not None:
                    _serve(metrics, request.metrics_port, request.metrics_address)
                if notifier is not None:
                    notifier.start()
                started()
                watcher.run(request.duration, stop)
            finally:
                watcher.stop()
                if notifier is not None:
                    notifier.stop(DRAIN_SECONDS)
                if metrics is not None:
                    metrics.close()
    finally:
        state.close()
    statuses, errors = watcher.statuses(), tuple(watcher.errors)
    stopped = stop.is_set()
    code = int(ExitCode.OK) if stopped else final_code(statuses, errors)
    return WatchResult(code, statuses, errors, stopped)


def _serve(metrics: Metrics, port: int, address: str) -> None:
    try:
        metrics.serve(port, address)
    except OSError as exc:
        raise UsageError(
            f"--metrics-port {port}: cannot listen on {address}:{port}: {exc.strerror or exc}"
        ) from None
