"""Each `launcher job` command's run: a function of an inventory, its request and where its
lines go (`JobSinks`): the job loaded, its nodes' connections opened for the phase and closed
after (`job.on_job`), the phase run. The CLI (`cli/job.py`) and the Python API
(`Launcher.jobs`) both call these through the command table, so they cannot drift.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, replace

from launcher.config.models import Inventory
from launcher.core.errors import UsageError
from launcher.core.jobrequests import (
    JobDeployRequest,
    JobHistoryRequest,
    JobLogsRequest,
    JobRollbackRequest,
    JobStatusRequest,
    JobStopRequest,
    JobVerifyRequest,
    JobWatchRequest,
)
from launcher.core.requests import DeployOptions, ProbeOverrides
from launcher.jobs.deploy import JobResult, Say, deploy_job, stop_job
from launcher.jobs.history import JobHistory, job_history
from launcher.jobs.job import load_job, on_job
from launcher.jobs.logs import JobLogs, NodeLine, job_logs
from launcher.jobs.rollback import rollback_job
from launcher.jobs.verify import status_job, verify_job
from launcher.watch.job import JobWatchResult, job_state_path, watch_job


def _nowhere(*_: str) -> None:
    return None


@dataclass(frozen=True)
class JobSinks:
    """Where a job command's lines go: progress (node, line), a log's lines (node, line), a
    watch's events; `stop` ends a watch from another thread."""

    say: Say = _nowhere
    line: NodeLine = _nowhere
    event: Callable[[str], None] = _nowhere
    stop: threading.Event | None = None


NOWHERE = JobSinks()


def deploy(inventory: Inventory, request: JobDeployRequest, sinks: JobSinks = NOWHERE) -> JobResult:
    """Every node's checks, then every old run stopped (`restart`), then every node launched
    (or, when some fail, none: unless `keep_partial`)."""
    options = DeployOptions(
        restart=request.restart,
        dry_run=request.dry_run,
        checkpoint_mode=request.checkpoint_mode,
        grace=request.grace,
        kill_gpu_holders=request.kill_gpu_holders,
    )
    return on_job(
        load_job(inventory, request.name),
        lambda j, nodes: deploy_job(
            j, nodes, options, sinks.say, keep_partial=request.keep_partial
        ),
    )


def verify(inventory: Inventory, request: JobVerifyRequest, sinks: JobSinks = NOWHERE) -> JobResult:
    """The job's startup probe: the status rank's, every other node alive throughout."""
    overrides = ProbeOverrides(
        wait=request.wait, interval=request.interval, successes=request.successes
    )
    return on_job(
        load_job(inventory, request.name),
        lambda j, nodes: verify_job(j, nodes, overrides, sinks.say),
    )


def status(
    inventory: Inventory, request: JobStatusRequest, sinks: JobSinks = NOWHERE
) -> list[JobResult]:
    """One poll of each named job (none named: every job of the inventory)."""
    chosen = list(request.names) or list(inventory.spec.jobs)
    if not chosen:
        raise UsageError(f"{inventory.path}: no jobs", hint="a job is defined under `jobs:`")
    return [on_job(load_job(inventory, name), status_job) for name in chosen]


def stop(inventory: Inventory, request: JobStopRequest, sinks: JobSinks = NOWHERE) -> JobResult:
    """Every node's run stopped at once."""
    return on_job(
        load_job(inventory, request.name),
        lambda j, nodes: stop_job(j, nodes, request.grace, sinks.say),
    )


def history(
    inventory: Inventory, request: JobHistoryRequest, sinks: JobSinks = NOWHERE
) -> JobHistory:
    """The job's deploys from every node's own records, newest first."""
    return on_job(
        load_job(inventory, request.name),
        lambda j, nodes: job_history(j, nodes, limit=request.limit),
    )


def rollback(
    inventory: Inventory, request: JobRollbackRequest, sinks: JobSinks = NOWHERE
) -> JobResult:
    """Every node back to its previous version, all or none."""
    return on_job(
        load_job(inventory, request.name),
        lambda j, nodes: rollback_job(j, nodes, sinks.say, request),
    )


def logs(inventory: Inventory, request: JobLogsRequest, sinks: JobSinks = NOWHERE) -> JobLogs:
    """Every chosen node's last lines to `sinks.line`, then with `follow` their new ones."""
    return on_job(
        load_job(inventory, request.name),
        lambda j, nodes: job_logs(j, nodes, sinks.line, request),
    )


def watch(
    inventory: Inventory, request: JobWatchRequest, sinks: JobSinks = NOWHERE
) -> JobWatchResult:
    """The job's verdict polled until `duration` passes or `sinks.stop` is set; each change
    to `sinks.event` and, as events, to the state file (default: one per inventory and job),
    the webhooks and commands; with `restart_on_failure`, the whole job redeployed on a
    failure."""
    state = request.state or str(job_state_path(inventory.path, request.name))
    options = replace(request, state=state)
    return on_job(
        load_job(inventory, request.name),
        lambda j, nodes: watch_job(
            j, nodes, options, say=sinks.say, event=sinks.event, stop=sinks.stop
        ),
    )
