"""`launcher rollback`: the previous run put back through the deploy's locked transaction, and
which run that is (`RunBack`: also a watcher's restart and deploy's rollback on failure)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from launcher.agent import protocol as p
from launcher.config.models import Target
from launcher.container.agentclient import container_for
from launcher.container.pct import HostConnection
from launcher.core.errors import ExitCode
from launcher.core.requests import RollbackRequest
from launcher.deploy.deploy import TransactionMode, run_transaction, transaction_request
from launcher.deploy.localhistory import append_local_history
from launcher.targets.fleet import Outcome
from launcher.targets.workflow import Context, Step, StepSink


@dataclass(frozen=True)
class RunBack:
    """Which run a rollback puts back, and as what: `to_run` (default: the run the current one
    replaced); `relaunch` (a watcher's restart of the same run: not called a rollback);
    `need_spec` (refuse unless its command and env were kept); `expect_run` (only if this run
    is the one running); `restart_count` (LAUNCHER_RESTART_COUNT); `record`: added to its
    deploy record."""

    to_run: str | None = None
    relaunch: bool = False
    need_spec: bool = False
    expect_run: str | None = None
    restart_count: int = 0
    record: dict[str, Any] = field(default_factory=dict)

    def apply(self, request: p.TransactionRequest) -> None:
        request.update(
            {
                "to_run": self.to_run,
                "relaunch": self.relaunch,
                "need_spec": self.need_spec,
                "expect_run": self.expect_run,
                "restart_count": self.restart_count,
            }
        )
        request["record"].update(self.record)


def _is_sha256(text: str) -> bool:
    return len(text) == 64 and all(c in "0123456789abcdef" for c in text)


@dataclass
class RollbackResult:
    exit_code: ExitCode
    summary: str
    sha256: str = ""
    rolled_back_from: str | None = None
    steps: list[Step] = field(default_factory=list)
    result: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "exit_code": int(self.exit_code)}


def run_rollback(ctx: Context, request: RollbackRequest) -> RollbackResult:
    """`launcher rollback` on the context's target: steps to the context as they happen."""
    return rollback(
        ctx.target,
        ctx.conn,
        restart=request.restart,
        grace=request.grace,
        keep_checkpoints=request.keep_checkpoints,
        restore_checkpoints=not request.no_checkpoints,
        wait_lock=request.wait_lock,
        on_step=ctx.step,
    )


def rollback_row(ctx: Context, result: RollbackResult) -> Outcome:
    return Outcome(ctx.target.name, result.exit_code, result.summary, value=result)


def rollback(
    target: Target,
    conn: HostConnection,
    *,
    restart: bool = False,
    grace: float | None = None,
    keep_checkpoints: bool = False,
    restore_checkpoints: bool = False,
    wait_lock: float = 0.0,
    on_step: StepSink = lambda step: None,
    plan: bool = False,
    run_id: str | None = None,
    job: str | None = None,
    back: RunBack | None = None,
) -> RollbackResult:
    """Put the previous run back and relaunch, through the same locked transaction as deploy
    (guards, stop, checkpoints, launch, record): its script (the kept copy of its sha256, or
    <dest>.prev), its command and env (from the spec kept when it was launched) and, with
    `restore_checkpoints`, its archived checkpoints moved back in place. No previous version,
    or an active run without `restart`, refuses (exit 4).

    `plan` runs the transaction's checks alone (nothing changed, nothing recorded); `run_id` and
    `job` are a multi-node job's (launcher.jobs.rollback): the run id every node records. `back`:
    which run to put back and how (a watcher's restart, deploy's rollback on failure)."""
    spec = target.playbook.spec
    wait = spec.stop_grace if grace is None else grace
    result = RollbackResult(ExitCode.OK, "")

    def emit(name: str, status: str, detail: str) -> None:
        step = Step(name, status, detail)
        result.steps.append(step)
        on_step(step)

    mode: TransactionMode = "restore" if restore_checkpoints else "archive"
    request = transaction_request(
        target,
        op="rollback",
        restart=restart,
        grace=wait,
        mode="keep" if keep_checkpoints else mode,
    )
    request["wait_lock"] = wait_lock
    if back is not None:
        back.apply(request)
    if plan:
        request.update({"plan": True, "keep_going": False})
    if run_id is not None:
        request["run_id"] = run_id
    if job is not None:
        request["record"]["job"] = job
        # The job gives every node its env (ranks, JOB_ID) anew: its rollback is the previous
        # script version with the playbook's command and env, on every node alike.
        request["use_spec"] = False
    if spec.project is not None:
        # A project: `current` goes back to the release before it (verified, its setup done).
        request["release"] = {"rollback": True, "keep_releases": spec.project.keep_releases}
    container = container_for(target, conn)
    applied = run_transaction(
        container, request, emit, timeout=wait + wait_lock + conn.endpoint.command_timeout
    )
    if plan:
        # The version the node would go back to: the `verify` check's sha256 of the copy of
        # <dest>.prev (a job's nodes must agree on it).
        checked = [s.detail.strip() for s in result.steps if s.name == "verify"]
        result.sha256 = checked[-1] if checked and _is_sha256(checked[-1]) else ""
        result.summary = f"{target.label}: the rollback's checks passed"
        return result
    saved = applied.get("record") or request["record"]
    result.sha256 = str(saved.get("sha256") or "")
    result.rolled_back_from = saved.get("rolled_back_from")
    result.result = {k: applied.get(k) for k in ("script", "stopped", "checkpoints", "launched")}
    append_local_history(target.name, saved)
    was = (result.rolled_back_from or "?")[:12]
    result.summary = f"rolled back {target.label}: sha256 {result.sha256[:12]} (was {was})"
    moved = applied.get("checkpoints") or {}
    restored = (
        f"; checkpoints {moved.get('from')} back in place"
        if moved.get("action") == "restore"
        else ""
    )
    result.summary += restored
    release = applied.get("release")
    if isinstance(release, dict):
        result.result["release"] = release
        result.summary = (
            f"rolled back {target.label}: release {release.get('id')} "
            f"(was {release.get('rollback_from')}){restored}"
        )
    return result
