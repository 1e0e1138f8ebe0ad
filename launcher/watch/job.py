"""A multi-node job as a watch's subject: `launcher job watch` is `launcher watch`'s session
(`launcher.watch.session.run_watch`) over one subject, the job, so everything a target's watch
does a job's does too: the state file (one record for the job), the events and their receivers
(webhooks, `--exec`), the metrics, the restart budget and its backoff. An event's target is the
job; its host and VMID are the status rank's, whose series carry the job's status, step, loss
and restarts; every other node's series carry its own state.

A poll is `launcher job status` (the status rank judged, every node alive, in one run, its GPUs
held), counted by the verdict policy (`launcher.verify.policy`): a node whose run is gone,
restarted or replaced fails at once (its rank stalls every other), any other failing node after
`failures` polls in a row. A finished job (every node exited 0) is reported and never
restarted. A restart is `job deploy --restart --keep-checkpoints` (all or nothing, the run id
named beforehand, the network and the rendezvous chosen again, so every node gets the same run
environment), then the job's startup probe.
"""

from __future__ import annotations

import dataclasses
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from launcher.core.errors import ExitCode, LauncherError, RemoteError, UsageError
from launcher.core.jobrequests import JobWatchRequest
from launcher.core.requests import ProbeOverrides
from launcher.jobs.deploy import JobResult, Say, deploy_job, stop_job
from launcher.jobs.job import Job, JobNodes
from launcher.jobs.verify import status_job, verify_job
from launcher.verify.policy import Tally, outcome
from launcher.verify.results import CheckResult, Failure, Verdict
from launcher.watch.events import Event
from launcher.watch.judging import Observation
from launcher.watch.metrics import Metrics
from launcher.watch.monitor import Note
from launcher.watch.session import run_watch, watch_request
from launcher.watch.state import default_state_path
from launcher.watch.target import RESTART_OPTIONS

HOUR = 3600.0
# A node's state word (jobs.verify) as the metrics' status.
NODE_STATUS = {
    "healthy": "healthy",
    "alive": "healthy",
    "finished": "finished",
    "unreachable": "unreachable",
}
# A node in one of these states is out of the job's run: the job is unhealthy at once.
GONE = ("dead", "restarted", "other run")


FAILURES = 2  # unhealthy polls in a row that make a failure


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


def node_checks(polled: JobResult) -> list[CheckResult]:
    """Each node's state as a check result the verdict policy counts (see the module)."""
    return [
        CheckResult(
            f"node {node.node}",
            Verdict.FAIL if node.exit_code else Verdict.PASS,
            node.detail,
            "alive, in the job's run",
            Failure.IMMEDIATE if node.state in GONE else Failure.DEFINITE,
        )
        for node in polled.nodes
    ]


class JobSubject:
    """The job as one watched subject: its poll and its restart plugged into the watch."""

    restarted = "redeployed with checkpoints kept"

    def __init__(self, job: Job, nodes: JobNodes, options: JobWatchRequest, say: Say) -> None:
        self.job, self.nodes, self.say = job, nodes, say
        status_node = job.nodes[job.status_rank]
        self.name, self.host, self.vmid = job.name, status_node.host_name, status_node.vmid
        self.series = (status_node.name, status_node.host_name, status_node.vmid)
        self.interval = options.interval
        self.failures = FAILURES
        self.tally = Tally(FAILURES)
        self.run: str | None = None
        self.last: JobResult | None = None
        self.seconds = 0.0  # how long the last poll took

    def observe(self) -> Observation:
        started = time.monotonic()
        polled = status_job(self.job, self.nodes)
        self.last, self.seconds = polled, time.monotonic() - started
        word = polled.summary.partition(":")[0]
        if word == "unreachable":
            raise RemoteError(polled.summary)
        if polled.run_id is not None and polled.run_id != self.run:
            self.run, self.tally = polled.run_id, Tally(self.failures)
        latest = polled.latest
        step = latest.number("step") if latest is not None else None
        obs = Observation(
            "finished",
            polled.summary,
            self.run,  # a poll that names no run (its session gone) is of the last one seen
            step=None if step is None else int(step),
            loss=latest.number("loss") if latest is not None else None,
            last_lines=polled.last_lines,
        )
        if word != "finished":
            judged = self.tally.take(node_checks(polled), judging=True)
            found = outcome(judged, judging=True, successes=1, window_over=False)
            obs.verdict = found if found in ("healthy", "unhealthy") else "pending"
        return obs

    def export(self, metrics: Metrics) -> None:
        """Every node's GPUs; every other node's state (the status rank's is the job's)."""
        if self.last is None:
            return
        targets = {t.name: t for t in self.job.nodes}
        for node in self.last.nodes:
            target = targets[node.node]
            labels = metrics.labels(target.name, target.host_name, target.vmid)
            if node.rank != self.job.status_rank:
                metrics.set_status(labels, NODE_STATUS.get(node.state, "unhealthy"))
                metrics.set_poll(labels, self.seconds, node.state != "unreachable")
            sample = self.last.gpus.get(node.node)
            if sample is not None:
                metrics.set_gpus(labels, sample)

    def hold(self, run: str | None) -> str | None:
        return None

    def marker(self, run_id: str) -> str:
        return run_id

    def restart(self, run: str | None, count: int, of: int, run_id: str, note: Note) -> str | None:
        note(f"restarting the job ({count}/{of})")
        options = dataclasses.replace(RESTART_OPTIONS, run_id=run_id)
        deployed = deploy_job(self.job, self.nodes, options, self.say)
        note(f"redeploy: {deployed.summary}")
        if deployed.exit_code:
            raise LauncherError(deployed.summary)
        return deployed.run_id

    def after_restart(self, note: Note) -> None:
        probed = verify_job(self.job, self.nodes, ProbeOverrides(), self.say)
        note(f"after the restart: {probed.summary}")

    def stop(self, run: str | None) -> str:
        return stop_job(self.job, self.nodes, None, self.say).summary


def watch_job(
    job: Job,
    nodes: JobNodes,
    options: JobWatchRequest,
    *,
    say: Say,
    event: Callable[[str], None],
    stop: threading.Event | None = None,
) -> JobWatchResult:
    """Watch the job until --for is over or `stop` is set; each event and note a line to
    `event`. A restart under way when `stop` is set finishes first (a redeploy is not left
    half-done)."""
    if options.state is None:
        raise UsageError("a job's watch keeps a state file: give one (job_state_path)")
    stop = stop or threading.Event()
    result = JobWatchResult(job.name)

    def line(text: str) -> None:
        stamped = f"{datetime.now(timezone.utc):%Y-%m-%dT%H:%M:%SZ} job {job.name}: {text}"
        result.events.append(stamped)
        event(stamped)

    def shown(happened: Event) -> None:
        result.restarts += happened.kind == "restart"
        line(happened.reason)

    request = watch_request(options, Path(options.state))
    subject = JobSubject(job, nodes, options, say)
    ended = run_watch(nullcontext([subject]), request, shown, stop)
    record = ended.statuses.get(job.name)
    result.status = record.status if record is not None else result.status
    result.exit_code, result.stopped = ExitCode(ended.exit_code), ended.stopped
    if ended.stopped:
        line("watch ended by SIGTERM")
    return result


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
