"""Each `launcher job` command as one function of an inventory: the job loaded, its nodes'
connections opened for the phase and closed after (`job.on_job`), the phase run. The CLI
(`cli/job.py`) and the Python API (`Launcher.jobs`) both call these, so they cannot drift.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Sequence

from launcher.config.models import Inventory
from launcher.core.errors import UsageError
from launcher.core.requests import ProbeOverrides
from launcher.deploy.deploy import DeployOptions
from launcher.jobs.deploy import JobResult, Say, deploy_job, stop_job
from launcher.jobs.history import JobHistory, job_history
from launcher.jobs.job import load_job, on_job
from launcher.jobs.logs import JobLogs, JobLogsOptions, NodeLine, job_logs
from launcher.jobs.rollback import JobRollbackOptions, rollback_job
from launcher.jobs.verify import status_job, verify_job
from launcher.watch.job import JobWatchOptions, JobWatchResult, job_state_path, watch_job


def deploy(
    inventory: Inventory,
    name: str,
    options: DeployOptions,
    say: Say,
    *,
    keep_partial: bool = False,
) -> JobResult:
    """Every node's checks, then every old run stopped (`restart`), then every node launched
    (or, when some fail, none: unless `keep_partial`)."""
    return on_job(
        load_job(inventory, name),
        lambda j, nodes: deploy_job(j, nodes, options, say, keep_partial=keep_partial),
    )


def verify(inventory: Inventory, name: str, overrides: ProbeOverrides, say: Say) -> JobResult:
    """The job's startup probe: the status rank's, every other node alive throughout."""
    return on_job(load_job(inventory, name), lambda j, nodes: verify_job(j, nodes, overrides, say))


def status(inventory: Inventory, names: Sequence[str] = ()) -> list[JobResult]:
    """One poll of each named job (none named: every job of the inventory)."""
    chosen = list(names) or list(inventory.spec.jobs)
    if not chosen:
        raise UsageError(f"{inventory.path}: no jobs", hint="a job is defined under `jobs:`")
    return [on_job(load_job(inventory, name), status_job) for name in chosen]


def stop(inventory: Inventory, name: str, grace: float | None, say: Say) -> JobResult:
    """Every node's run stopped at once."""
    return on_job(load_job(inventory, name), lambda j, nodes: stop_job(j, nodes, grace, say))


def history(inventory: Inventory, name: str, limit: int = 0) -> JobHistory:
    """The job's deploys from every node's own records, newest first."""
    return on_job(load_job(inventory, name), lambda j, nodes: job_history(j, nodes, limit=limit))


def rollback(inventory: Inventory, name: str, options: JobRollbackOptions, say: Say) -> JobResult:
    """Every node back to its previous version, all or none."""
    return on_job(load_job(inventory, name), lambda j, nodes: rollback_job(j, nodes, say, options))


def logs(inventory: Inventory, name: str, options: JobLogsOptions, on_line: NodeLine) -> JobLogs:
    """Every chosen node's last lines to `on_line`, then with `follow` their new ones."""
    return on_job(load_job(inventory, name), lambda j, nodes: job_logs(j, nodes, on_line, options))


def watch(
    inventory: Inventory,
    name: str,
    options: JobWatchOptions,
    *,
    say: Say,
    event: Callable[[str], None],
    stop: threading.Event | None = None,
) -> JobWatchResult:
    """The job's verdict polled until `options.duration` passes or `stop` is set; each change
    to `event` and, as events, to the state file (default: one per inventory and job), the
    webhooks and commands; with `restart_on_failure`, the whole job redeployed on a failure."""
    if options.state_path is None:
        options = dataclasses.replace(options, state_path=job_state_path(inventory.path, name))
    return on_job(
        load_job(inventory, name),
        lambda j, nodes: watch_job(j, nodes, options, say=say, event=event, stop=stop),
    )
