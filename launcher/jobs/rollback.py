"""Roll a multi-node job back to its previous version on every node, all or nothing.

The same phases as a job's deploy (launcher.jobs.deploy.run_phases): the rollback transaction in
plan mode on every node (a previous version there, the lock free, no active run without
--restart...), then every old run stopped, then every node rolled back with one new run id.
The summary names the script versions the nodes run now (one sha256 when they agree).
"""

from __future__ import annotations

from collections.abc import Callable

from launcher.config.models import Target
from launcher.container.pct import HostConnection
from launcher.core.jobrequests import JobRollbackRequest
from launcher.jobs.deploy import JobResult, Phases, Say, run_phases
from launcher.jobs.job import Job, JobNodes
from launcher.operate.rollback import RollbackResult, rollback
from launcher.targets.workflow import Step


def rollback_job(job: Job, nodes: JobNodes, say: Say, options: JobRollbackRequest) -> JobResult:
    """Every node back to its previous script version, with one new run id (see the module)."""

    def run(
        target: Target, conn: HostConnection, run_id: str, plan: bool, show: Callable[[Step], None]
    ) -> RollbackResult:
        return rollback(
            target,
            conn,
            restart=options.restart,
            grace=options.grace,
            keep_checkpoints=options.keep_checkpoints,
            on_step=show,
            plan=plan,
            run_id=run_id,
            job=job.name,
        )

    phases = Phases(
        "rollback", run, restart=options.restart, dry_run=options.dry_run, grace=options.grace
    )
    return run_phases(job, nodes, phases, say)
