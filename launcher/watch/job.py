"""Watch a multi-node job as `launcher watch` watches a target: its one verdict polled, each
transition an event (state file, webhooks, `--exec`, metrics per node and per GPU), and on
failure, optionally, the whole job redeployed within a restart budget with backoff.

The machinery is `launcher watch`'s own (`launcher.watch`): the state file (`WatchState`, one
record for the job), the notifier, the metrics, the event schema and the restart policy
(`RestartPolicy`: at most N restarts in a sliding window, with backoff). An event's target is
the job; its host and VMID are the status rank's.

A poll is `launcher job status` (the status rank judged, every node alive, in one run, its GPUs
held). A failure is that many unhealthy polls in a row (a node that is gone counts at once: its
rank stalls every other). A finished job (every node exited 0) is reported and never restarted.
A restart is `job deploy --restart --keep-checkpoints` (all or nothing, one new run id, the
network and the rendezvous chosen again, so every node gets the same run environment), then
the job's startup probe. When the budget is spent the job is stopped (as `launcher watch`
leaves a run stopped) and the watch ends, exit 1. SIGTERM ends the watch cleanly: after the
step under way, with a last line and exit 0.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from launcher.core.errors import ExitCode, UsageError
from launcher.core.requests import ProbeOverrides
from launcher.deploy.deploy import DeployOptions
from launcher.jobs.deploy import JobResult, Say, deploy_job, stop_job
from launcher.jobs.job import Job, JobNodes
from launcher.jobs.verify import status_job, verify_job
from launcher.watch.events import Event
from launcher.watch.metrics import Metrics
from launcher.watch.monitor import Hub
from launcher.watch.notify import Notifier
from launcher.watch.policy import RestartPolicy
from launcher.watch.session import DRAIN_SECONDS, final_code, receivers
from launcher.watch.state import TargetRecord, WatchState, default_state_path

HOUR = 3600.0
RESTART_OPTIONS = DeployOptions(restart=True, checkpoint_mode="keep")
# A node's state word (jobverify) as the watch metrics' status.
NODE_STATUS = {
    "healthy": "healthy",
    "alive": "healthy",
    "finished": "finished",
    "unreachable": "unreachable",
}


@dataclass(frozen=True)
class JobWatchOptions:
    interval: float = 10.0
    duration: float | None = None  # None: until interrupted
    restart_on_failure: bool = False
    max_restarts: int = 3
    failures: int = 2  # unhealthy polls in a row that make a failure
    restart_window: float = HOUR
    restart_backoff: float = 10.0
    state_path: Path | None = None  # None: no state file, no notifier, no metrics
    webhooks: tuple[str, ...] = ()
    commands: tuple[str, ...] = ()
    metrics_port: int | None = None
    metrics_address: str = "127.0.0.1"

    @property
    def policy(self) -> RestartPolicy:
        return RestartPolicy(self.max_restarts, self.restart_window, self.restart_backoff)


@dataclass
class JobWatchResult:
    job: str
    exit_code: ExitCode = ExitCode.OK
    restarts: int = 0
    events: list[str] = field(default_factory=list)
    status: str = "starting"  # the job's status at the end (the watch's statuses)
    stopped: bool = False  # ended by SIGTERM


def job_state_path(inventory: Path, name: str) -> Path:
    """A job's own state file, beside `launcher watch`'s for the same inventory."""
    path = default_state_path(inventory)
    return path.with_name(f"{path.stem}.job-{name}.json")


def _gone(result: JobResult) -> bool:
    """A node's run is gone (not merely judged unhealthy): no need to wait for more polls."""
    return any(n.state in ("dead", "restarted", "other run") for n in result.nodes)


@contextmanager
def outlets(options: JobWatchOptions) -> Iterator[Hub | None]:
    """The state file, the notifier and the metrics server, opened in that order and closed
    in reverse (as `launcher watch`'s session); None without a state file."""
    found = receivers(options.webhooks, options.commands)  # a bad one: exit 2, nothing opened
    if options.state_path is None:
        if found or options.metrics_port:
            raise UsageError("--webhook, --exec and --metrics-port need a state file")
        yield None
        return
    state = WatchState(options.state_path).open()
    notifier = Notifier(found, state) if found else None
    metrics = Metrics() if options.metrics_port else None
    try:
        if metrics is not None and options.metrics_port is not None:
            try:
                metrics.serve(options.metrics_port, options.metrics_address)
            except OSError as exc:
                raise UsageError(
                    f"--metrics-port {options.metrics_port}: cannot listen on "
                    f"{options.metrics_address}:{options.metrics_port}: {exc.strerror or exc}"
                ) from None
        if notifier is not None:
            notifier.start()
        yield Hub(state, notifier, metrics, lambda event: None)
    finally:
        if notifier is not None:
            notifier.stop(DRAIN_SECONDS)
        if metrics is not None:
            metrics.close()
        state.close()


def watch_job(
    job: Job,
    nodes: JobNodes,
    options: JobWatchOptions,
    *,
    say: Say,
    event: Callable[[str], None],
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] | None = None,
    stop: threading.Event | None = None,
) -> JobWatchResult:
    """Poll until --for is over, the restart budget is spent or `stop` is set; report each
    transition. A poll or restart under way when `stop` is set finishes first (a redeploy is
    not left half-done)."""
    stop = stop or threading.Event()
    with outlets(options) as hub:
        watch = JobWatch(job, nodes, options, hub, say, event, stop)
        watch.pause = sleep or stop.wait  # waiting on `stop`: SIGTERM ends a wait at once
        watch.clock = clock
        return watch.run()


class JobWatch:
    """One job's watch: its record (in the state file when there is one), its transitions."""

    def __init__(
        self,
        job: Job,
        nodes: JobNodes,
        options: JobWatchOptions,
        hub: Hub | None,
        say: Say,
        event: Callable[[str], None],
        stop: threading.Event,
    ) -> None:
        self.job, self.nodes, self.options, self.hub = job, nodes, options, hub
        self.say, self.event, self.stop = say, event, stop
        self.result = JobWatchResult(job.name)
        self.record = hub.state.record(job.name) if hub else TargetRecord()
        self.status_node = job.nodes[job.status_rank]
        self.pause: Callable[[float], object] = stop.wait
        self.clock: Callable[[], float] = time.monotonic
        self.last: JobResult | None = None

    def run(self) -> JobWatchResult:
        options = self.options
        end = None if options.duration is None else self.clock() + options.duration
        shown = ""  # the verdict word last reported: healthy, finished, unhealthy, unreachable
        failing = 0
        while not self.stop.is_set() and (end is None or self.clock() < end):
            polled = self.poll()
            word = polled.summary.partition(":")[0]
            ok = polled.exit_code == ExitCode.OK
            failing = 0 if ok else failing + (options.failures if _gone(polled) else 1)
            # Changes whenever ok does, and healthy -> finished; an unhealthy poll is said once
            # it counts (failures in a row), as watch says it: one bad poll is not a verdict.
            counted = word != "unhealthy" or failing >= options.failures
            if word != shown and counted:
                self.note(polled.summary)
                shown = word
            self.on_word(word, polled)  # a transition only when the job's status changes
            if self.stop.is_set():
                break  # no restart begins after SIGTERM
            if failing < options.failures or word == "unreachable":
                self.pause(options.interval)  # unreachable is never a reason to restart
                continue
            if self.record.status != "unhealthy":
                self.record.bad = True
                self.transition("unhealthy", "unhealthy", polled.summary, run=polled.run_id)
            if not options.restart_on_failure:
                failing = 0  # reported once; keep watching
                self.pause(options.interval)
                continue
            if not self.recover():
                break
            shown, failing = "healthy", 0  # a poll not healthy after the restart is reported
        return self.finish()

    # -- one poll -------------------------------------------------------------------------

    def poll(self) -> JobResult:
        started = time.monotonic()
        polled = status_job(self.job, self.nodes)
        self.last = polled
        self.result.exit_code = polled.exit_code
        self.export(polled, time.monotonic() - started)
        return polled

    def on_word(self, word: str, polled: JobResult) -> None:
        """The verdict changed: its event (an unhealthy one waits for the failure count)."""
        if word != "unreachable" and not self.record.reachable:
            self.record.reachable = True
            self.transition("reachable", self.record.status, "every node answers again")
        if word == "healthy" and self.record.status != "healthy":
            kind = "recovered" if self.record.bad else "healthy"
            self.record.bad = False
            self.transition(kind, "healthy", polled.summary, run=polled.run_id)
        elif word == "finished" and self.record.status != "finished":
            self.record.bad = False
            self.transition("finished", "finished", polled.summary, run=polled.run_id)
        elif word == "unreachable" and self.record.reachable:
            self.record.reachable = False
            self.transition("unreachable", self.record.status, polled.summary)

    def export(self, polled: JobResult, seconds: float) -> None:
        """Every node's status, poll and GPUs; the status rank's step and loss."""
        metrics = self.hub.metrics if self.hub else None
        if metrics is None:
            return
        targets = {t.name: t for t in self.job.nodes}
        for node in polled.nodes:
            target = targets[node.node]
            labels = metrics.labels(target.name, target.host_name, target.vmid)
            metrics.set_status(labels, NODE_STATUS.get(node.state, "unhealthy"))
            metrics.set_poll(labels, seconds, node.state != "unreachable")
            sample = polled.gpus.get(node.node)
            if sample is not None:
                metrics.set_gpus(labels, sample)
        latest = polled.latest
        if latest is not None:
            target = self.status_node
            labels = metrics.labels(target.name, target.host_name, target.vmid)
            metrics.set_sample(
                labels,
                step=_int(latest.number("step")),
                throughput=None,
                loss=latest.number("loss"),
                queues={},
                since_step=None,
            )

    # -- recovery -------------------------------------------------------------------------

    def recover(self) -> bool:
        """The whole job redeployed within the policy, after its backoff; False: the watch
        ends (the budget spent and the job stopped, or a redeploy that failed)."""
        policy, record = self.options.policy, self.record
        now = time.time()
        if not policy.allowed(record.restarts, now):
            self.give_up()
            return False
        delay = policy.delay(record.restarts, now)
        self.note(f"restarting in {delay:g} s (backoff)")
        self.pause(delay)
        if self.stop.is_set():
            return False
        record.restarts = [*policy.recent(record.restarts, now), time.time()]
        self.result.restarts += 1
        count = len(record.restarts)
        record.status = "restarting"
        self.save()  # counted before it starts: a watch killed mid-restart gets no extra one
        self.note(f"restarting the job ({count}/{policy.max_restarts})")
        deployed = deploy_job(self.job, self.nodes, RESTART_OPTIONS, self.say)
        self.note(f"redeploy: {deployed.summary}")
        if deployed.exit_code:
            why = f"restart {count} of {policy.max_restarts} failed: {deployed.summary}"
            self.transition("restart", "unhealthy", why)
            self.result.exit_code = deployed.exit_code
            return False
        why = f"redeployed with checkpoints kept (restart {count} of {policy.max_restarts})"
        self.transition("restart", "restarting", why, run=deployed.run_id)
        probed = verify_job(self.job, self.nodes, ProbeOverrides(), self.say)
        self.note(f"after the restart: {probed.summary}")
        return True

    def give_up(self) -> None:
        policy = self.options.policy
        self.record.gave_up_run = self.record.run
        self.note(f"failed again; {len(self.record.restarts)} restart(s) spent: stopping it")
        stopped = stop_job(self.job, self.nodes, None, self.say)
        reason = (
            f"{len(self.record.restarts)} restarts in {policy.window:g} s, the limit: "
            f"left stopped ({stopped.summary})"
        )
        self.transition("gave_up", "stopped", reason)

    # -- plumbing -------------------------------------------------------------------------

    def finish(self) -> JobWatchResult:
        """The exit code as `launcher watch --for` gives it (session.final_code), or worse if
        the last poll was (unhealthy, not yet counted as a failure), or 3 for a redeploy that
        failed; SIGTERM: 0."""
        result = self.result
        result.status = self.record.status
        if self.stop.is_set():
            result.exit_code, result.stopped = ExitCode.OK, True
            self.note("watch ended by SIGTERM")
            return result
        code = final_code({self.job.name: self.record}, ())
        if self.record.status not in ("finished", "stopped"):
            code = max(code, int(result.exit_code))
        result.exit_code = ExitCode(code)
        return result

    def note(self, text: str) -> None:
        line = f"{datetime.now(timezone.utc):%Y-%m-%dT%H:%M:%SZ} job {self.job.name}: {text}"
        self.result.events.append(line)
        self.event(line)

    def save(self) -> None:
        if self.hub is not None:
            self.hub.state.update(self.job.name, self.record)

    def transition(self, kind: str, status: str, reason: str, *, run: str | None = None) -> None:
        """The job's status changes: recorded, and an event to the state and the receivers."""
        previous = self.record.status
        self.record.status = status
        if run is not None:
            self.record.run = run
        self.save()
        if self.hub is None:
            return
        latest = self.last.latest if self.last is not None else None
        target = self.status_node
        self.hub.emit(
            Event(
                kind=kind,
                target=self.job.name,
                host=target.host_name,
                vmid=target.vmid,
                run=self.record.run,
                status=status,
                previous=previous,
                reason=reason,
                last_lines=self.last.last_lines if self.last is not None else [],
                step=_int(latest.number("step")) if latest is not None else None,
                restarts=len(self.options.policy.recent(self.record.restarts, time.time())),
            )
        )
        metrics = self.hub.metrics
        if kind == "restart" and metrics is not None and status == "restarting":
            labels = metrics.labels(target.name, target.host_name, target.vmid)
            metrics.restarts.labels(**labels).inc()


def _int(value: float | None) -> int | None:
    return None if value is None else int(value)


@contextmanager
def terminated_by_sigterm() -> Iterator[threading.Event]:
    """An event SIGTERM sets (instead of killing the process with -15), for `watch_job`'s
    `stop`; the previous handler back after."""

    stop = threading.Event()

    def on_term(signum: int, frame: object) -> None:
        stop.set()

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        yield stop
    finally:
        signal.signal(signal.SIGTERM, previous)
