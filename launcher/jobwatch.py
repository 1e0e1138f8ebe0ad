"""Watch a multi-node job: its one verdict polled; on failure, optionally the whole job
redeployed with its checkpoints kept (every rank resumes), within a restart budget.

A poll is `launcher job status` (the status rank judged, every node alive, in one run, with no
restart). A failure is that many unhealthy polls in a row (a node that is gone counts at once:
its rank stalls every other). A restart is `job deploy --restart --keep-checkpoints` (all or
nothing, one new run id), then the job's startup probe; a probe that fails counts as the next
failure. SIGTERM ends the watch cleanly (`terminated`): after the step under way, with a
last line and exit 0, as `launcher watch` does.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone

from launcher.deploy import DeployOptions
from launcher.errors import ExitCode
from launcher.job import Job, JobNodes
from launcher.jobdeploy import JobResult, Say, deploy_job
from launcher.jobverify import status_job, verify_job
from launcher.requests import ProbeOverrides


@dataclass(frozen=True)
class JobWatchOptions:
    interval: float = 10.0
    duration: float | None = None  # None: until interrupted
    restart_on_failure: bool = False
    max_restarts: int = 3
    failures: int = 2  # unhealthy polls in a row that make a failure


@dataclass
class JobWatchResult:
    job: str
    exit_code: ExitCode = ExitCode.OK
    restarts: int = 0
    events: list[str] = field(default_factory=list)


def _gone(result: JobResult) -> bool:
    """A node's run is gone (not merely judged unhealthy): no need to wait for more polls."""
    return any(n.state in ("dead", "restarted", "other run") for n in result.nodes)


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
    change. A poll or restart under way when `stop` is set finishes first (a redeploy is not
    left half-done)."""
    stop = stop or threading.Event()
    # Waiting on `stop` rather than sleeping: SIGTERM ends the watch now, not an interval later.
    pause = sleep or stop.wait
    result = JobWatchResult(job.name)
    end = None if options.duration is None else clock() + options.duration
    shown = ""  # the verdict word last reported: healthy, finished, unhealthy, unreachable
    failing = 0

    def note(text: str) -> None:
        line = f"{datetime.now(timezone.utc):%Y-%m-%dT%H:%M:%SZ} job {job.name}: {text}"
        result.events.append(line)
        event(line)

    while not stop.is_set() and (end is None or clock() < end):
        polled = status_job(job, nodes)
        ok = polled.exit_code == ExitCode.OK
        result.exit_code = polled.exit_code
        # The word (jobverify.job_summary's) changes whenever `ok` does, and healthy -> finished.
        word = polled.summary.partition(":")[0]
        if word != shown:
            note(polled.summary)
            shown = word
        if stop.is_set():
            break  # no restart begins after SIGTERM
        failing = 0 if ok else failing + (options.failures if _gone(polled) else 1)
        if failing >= options.failures:
            if not options.restart_on_failure:
                failing = 0  # reported once above; keep watching
            elif result.restarts >= options.max_restarts:
                note(f"failed again; {result.restarts} restart(s) spent: left as it is")
                return result
            else:
                result.restarts += 1
                note(f"restarting the job ({result.restarts}/{options.max_restarts})")
                if not _restart(job, nodes, say, note):
                    result.exit_code = ExitCode.UNREACHABLE
                    return result
                shown, failing = "healthy", 0  # a poll not healthy after the restart is reported
                continue
        pause(options.interval)
    if stop.is_set():
        result.exit_code = ExitCode.OK
        note("watch ended by SIGTERM")
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


def _restart(job: Job, nodes: JobNodes, say: Say, note: Callable[[str], None]) -> bool:
    """The whole job redeployed with its checkpoints kept, then its startup probe."""
    options = DeployOptions(restart=True, checkpoint_mode="keep")
    deployed = deploy_job(job, nodes, options, say)
    note(f"redeploy: {deployed.summary}")
    if deployed.exit_code:
        return False
    probed = verify_job(job, nodes, ProbeOverrides(), say)
    note(f"after the restart: {probed.summary}")
    return True
