"""The result models of every `--json` output: the shipped JSON Schemas are generated from these.

Each command prints one envelope (see launcher/output/jsonout.py):
`{"schema": "launcher.<command>/<version>", "exit_code": N, "targets": [...], ...}`. A target's
item is the command's own document, or a TargetError when the command could not act on that target.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

ExitCodeValue = Literal[0, 1, 2, 3, 4, 5, 6, 7, 130]


class Closed(BaseModel):
    """Fields are only added within a version; an object that says so may carry keys not listed."""

    model_config = ConfigDict(extra="forbid")


class Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class TargetError(Closed):
    """A target the command could not act on (unreachable, config, refused): what stopped it."""

    target: str
    ok: Literal[False]
    exit_code: ExitCodeValue
    error: str


# -- verify (the published launcher.verify/2 target document), status, smoke ------------------


class CheckDoc(Closed):
    name: str
    verdict: Literal["pass", "warn", "fail", "skip"] = Field(
        description="skip: not judged (the run's status lines never carry the quantity and the "
        "playbook does not ask for it)"
    )
    observed: str
    expected: str
    failure: Literal["immediate", "definite", "pending"] | None = Field(
        None,
        description="how a failing check counts: at once, after failure_threshold polls in a "
        "row, or only at the window's end",
    )


class SampleDoc(Closed):
    index: int
    elapsed_min: float | None
    step: int | None
    loss: float | str | None = Field(description="a non-finite loss is a string: 'nan', 'inf'")
    throughput: float | None
    eta_seconds: float | None
    queues: dict[str, list[float | None] | None]
    nonfinite: list[str] | None = Field(
        None,
        description="JSON has no NaN or Infinity: the fields read as one (elapsed_min, "
        "throughput, eta_seconds, queues.<name>) are null here and named in this list",
    )


class Timings(Open):
    duration: float
    polls: int
    wait: float | None = None
    interval: float | None = None
    window: float | None = None
    successes: int | None = None
    failure_threshold: int | None = None
    poll_timeout: float | None = None


class VerifyDoc(Closed):
    """One target's probe report."""

    schema_id: Literal["launcher.verify/2"] = Field(alias="schema")
    target: str
    verdict: Literal["healthy", "unhealthy", "unreachable"] = Field(
        description="the exit code in words: healthy (0, nothing wrong), unhealthy (1), "
        "unreachable (3)"
    )
    state: (
        Literal[
            "deploying",
            "starting",
            "healthy",
            "unhealthy",
            "finished",
            "failed",
            "stopped",
            "absent",
        ]
        | None
    ) = Field(
        description="where the run is in its life; null when the target was unreachable. "
        "finished: it exited 0 (terminal success); failed: it exited non-zero; stopped: "
        "launcher stop (or a watcher) ended it; starting: within its warmup"
    )
    exit_code: Literal[0, 1, 2, 3]
    reason: str
    checks: list[CheckDoc]
    samples: list[SampleDoc]
    timings: Timings
    last_lines: list[str]
    run: str | None = Field(
        None,
        description="the run marker judged (the deploy's session:run id); null for a session "
        "launcher did not start",
    )
    deployed: dict[str, Any] | None = Field(
        None, description="launcher status only: the deploy record"
    )
    log_age: float | None = Field(
        None, description="launcher status only: seconds since the log was written"
    )
    gpus: dict[str, Any] | None = Field(
        None,
        description="launcher status only, with playbook gpus > 0: want (the playbook's gpus), "
        "held (GPU indexes the run's processes have open), devices ([index, utilization %, "
        "memory used MiB] per GPU), error (nvidia-smi's, or null)",
    )


# -- deploy ------------------------------------------------------------------------------------


class StepDoc(Open):
    name: str
    status: str = Field(description="ok | unchanged | skipped | warning | failed | planned")
    detail: str


class DeployDoc(Closed):
    """A deploy that went through (or a dry run's plan)."""

    target: str
    ok: Literal[True]
    exit_code: Literal[0]
    error: None
    sha256: str
    steps: list[StepDoc]
    result: dict[str, Any] = Field(
        description="the container's answer: what it stopped, moved, launched"
    )


Outcome = Literal[
    "deployed", "unhealthy", "rolled_back", "rolled_back_unhealthy", "rollback_failed"
]
OUTCOME_HELP = (
    "deployed (the new run healthy, exit 0) | unhealthy (no rollback asked, 1) | rolled_back "
    "(the previous run back and healthy, 5) | rolled_back_unhealthy (back, not healthy, 6) | "
    "rollback_failed (7)"
)


class VerifiedDeployDoc(Closed):
    """`deploy --verify [--rollback-on-failure]`: the deploy, the probe of its run and, when the
    probe failed and rollback was asked, the rollback and the probe of the run it put back."""

    target: str
    ok: bool = Field(description="true only when the new run is healthy")
    exit_code: ExitCodeValue
    error: str | None
    sha256: str
    steps: list[StepDoc] = Field(description="the deploy's steps, then the rollback's")
    result: dict[str, Any]
    outcome: Outcome = Field(description=OUTCOME_HELP)
    verify: VerifyDoc = Field(description="the probe of the new run")
    rollback: dict[str, Any] | None
    rollback_error: str | None
    rollback_verify: VerifyDoc | None


class DeployFailure(Closed):
    ok: Literal[False]
    exit_code: ExitCodeValue
    error: str


class SmokeDoc(Closed):
    """`deploy --restart`, then verify of the run it started."""

    target: str
    exit_code: ExitCodeValue
    deploy: DeployDoc | DeployFailure
    verify: VerifyDoc | None = Field(description="null when the deploy failed")
    # With --rollback-on-failure only:
    outcome: Outcome | None = Field(None, description=OUTCOME_HELP)
    rollback: dict[str, Any] | None = Field(
        None, description="the rollback's result (as `launcher rollback --json`), null if none"
    )
    rollback_error: str | None = Field(None, description="why the rollback failed")
    rollback_verify: VerifyDoc | None = Field(
        None, description="the probe of the run put back, null if none"
    )


# -- history, doctor ---------------------------------------------------------------------------


class HistoryDoc(Closed):
    target: str
    exit_code: Literal[0]
    path: str = Field(description="the record file in the container")
    records: list[dict[str, Any]] = Field(description="deploy records, newest first")
    diff: dict[str, Any] | None = Field(
        None,
        description="with --diff A B: from, to (the runs), changes (aspect: code, source, "
        "command, overrides with from/to; env added/removed/changed with names, never values), "
        "env_known",
    )


class DoctorCheck(Closed):
    name: str
    status: str = Field(description="ok | failed | skipped")
    detail: str
    fix: str | None


class DoctorDoc(Closed):
    target: str
    exit_code: ExitCodeValue
    summary: str
    checks: list[DoctorCheck]


# -- inventory check, buckets plan (no per-target work) ----------------------------------------


class InventoryTarget(Closed):
    target: str
    host: str
    vmid: int
    playbook: str
    session: str
    workdir: str
    script: str
    dest: str
    checkpoints: str
    command: str
    gpus: int


class InventoryExtra(Closed):
    inventory: str
    default_target: str | None
    hosts: dict[str, dict[str, Any]]
    groups: dict[str, list[str]]


class LsTarget(Closed):
    target: str
    host: str | None = Field(description="the inventory's host; null: a cluster target")
    vmid: int
    cluster: str | None = Field(description="the cluster whose nodes run the VMID, or null")
    jobs: list[str] = Field(description="the jobs the target is a node of")


class BucketsExtra(Closed):
    input: dict[str, Any]
    budget: int
    buckets: int
    max_len: int | None
    boundaries: list[int]
    model: dict[str, Any]
    bucket_stats: list[dict[str, Any]]
    batching: dict[str, dict[str, Any]]
    simulation: dict[str, Any]
    timings: dict[str, Any]
    playbook: dict[str, Any] | None


# -- launcher job: one item per job (one job, except `job status` of several) ------------------


class JobNodeDoc(Closed):
    """Where one node of the job was left, or what it showed."""

    rank: int
    node: str
    label: str
    state: str = Field(
        description="deploy/rollback: planned | unchanged | stopped | launched | failed; "
        "verify/status: healthy | unhealthy | alive | finished | dead | restarted | other run | "
        "gpus | unreachable | cut short | failed; stop: stopped | failed"
    )
    detail: str
    exit_code: ExitCodeValue


class JobDoc(Closed):
    """One job's result (`launcher job deploy|verify|status|stop|rollback --json`)."""

    job: str
    action: Literal["deploy", "rollback", "verify", "status", "stop"]
    ok: bool
    exit_code: ExitCodeValue
    summary: str
    run_id: str | None
    job_id: str | None = Field(description="`<job>-<run id>`: every node's JOB_ID")
    master: str | None = Field(description="rank 0's address, every node's MASTER_ADDR")
    rendezvous: Literal["c10d", "static"] | None = Field(
        description="the torchrun rendezvous the run was given (PET_RDZV_BACKEND)"
    )
    nodes: list[JobNodeDoc]


class JobRunDoc(Closed):
    run_id: str
    time: str
    sha256: str
    outcomes: dict[str, str] = Field(description="node -> its record's outcome, rank order")


class JobHistoryDoc(Closed):
    job: str
    exit_code: ExitCodeValue
    runs: list[JobRunDoc]
    errors: dict[str, str] = Field(description="node -> why its records could not be read")


class Contract(BaseModel):
    """One command's document: its target items and the keys beside `targets`."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    command: str
    title: str
    items: tuple[type[BaseModel], ...]
    extra: type[BaseModel] | None = None
    per_target: bool = True  # items repeated at the top level for one target


CONTRACTS = (
    Contract(command="verify", title="launcher verify", items=(VerifyDoc, TargetError)),
    Contract(command="status", title="launcher status", items=(VerifyDoc, TargetError)),
    Contract(command="smoke", title="launcher smoke", items=(SmokeDoc, TargetError)),
    Contract(
        command="deploy",
        title="launcher deploy",
        items=(DeployDoc, VerifiedDeployDoc, TargetError),
    ),
    Contract(command="history", title="launcher history", items=(HistoryDoc, TargetError)),
    Contract(command="doctor", title="launcher doctor", items=(DoctorDoc, TargetError)),
    Contract(command="job-deploy", title="launcher job deploy", items=(JobDoc,)),
    Contract(command="job-verify", title="launcher job verify", items=(JobDoc,)),
    Contract(command="job-status", title="launcher job status", items=(JobDoc,)),
    Contract(command="job-stop", title="launcher job stop", items=(JobDoc,)),
    Contract(command="job-rollback", title="launcher job rollback", items=(JobDoc,)),
    Contract(command="job-history", title="launcher job history", items=(JobHistoryDoc,)),
    Contract(
        command="inventory",
        title="launcher inventory check",
        items=(InventoryTarget,),
        extra=InventoryExtra,
        per_target=False,
    ),
    Contract(command="ls", title="launcher ls", items=(LsTarget,), per_target=False),
    Contract(
        command="buckets",
        title="launcher buckets plan",
        items=(),
        extra=BucketsExtra,
        per_target=False,
    ),
)
