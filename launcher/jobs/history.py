"""A job's deploys, from every node's own records: one entry per run id, each node's outcome.

A job's deploy records the same run id on every node (with `"job": <name>`), so the nodes'
records of one deploy are found by it; a node without a record of a run says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from launcher.core.errors import ExitCode
from launcher.jobs.job import Job, JobNodes
from launcher.operate.history import HistoryResult, history
from launcher.targets.fleet import worst


@dataclass
class JobRun:
    """One deploy of the job: when (the earliest node's record), what, and each node's outcome."""

    run_id: str
    time: str
    sha256: str
    outcomes: dict[str, str] = field(default_factory=dict)  # node -> outcome, rank order

    def to_json(self) -> dict[str, Any]:
        return dict(vars(self))


@dataclass
class JobHistory:
    job: str
    runs: list[JobRun]  # newest first
    errors: dict[str, str]  # node -> why its records could not be read
    exit_code: ExitCode

    def to_json(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "exit_code": int(self.exit_code),
            "runs": [r.to_json() for r in self.runs],
            "errors": self.errors,
        }


def job_history(job: Job, nodes: JobNodes, *, limit: int = 0) -> JobHistory:
    """Every node's records read at once, grouped by the job's run ids (newest first)."""
    read = nodes.each(lambda rank, target, conn: history(target, conn))
    runs: dict[str, JobRun] = {}
    errors = {r.target.name: r.error.message for r in read if r.error is not None}
    for entry in read:
        result: HistoryResult | None = entry.value
        for record in result.records if result else []:
            if record.get("job") != job.name:
                continue
            run_id = str(record.get("run") or "").partition(":")[2]
            if not run_id:
                continue
            run = runs.setdefault(run_id, JobRun(run_id, str(record.get("time") or ""), ""))
            run.time = min(run.time, str(record.get("time") or run.time))
            run.sha256 = run.sha256 or str(record.get("sha256") or "")
            run.outcomes[entry.target.name] = str(record.get("outcome") or "?")
    names = [t.name for t in nodes.targets]
    for run in runs.values():
        run.outcomes = {name: run.outcomes.get(name, "no record") for name in names}
    ordered = sorted(runs.values(), key=lambda r: r.run_id, reverse=True)
    if limit:
        ordered = ordered[:limit]
    code = worst([r.error.exit_code for r in read if r.error is not None])
    return JobHistory(job.name, ordered, errors, code)
