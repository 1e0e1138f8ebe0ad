"""The deploy workflow: the script and one locked transaction in the container.

pct invocations: one exec, the transaction (agent.py `Deploy`), which receives the script inline,
checks its sha256 and everything else that could stop the deploy, and only then changes things.
A script over INLINE_LIMIT is pushed first (`pct push` to a temp name in workdir, plus a
preflight that creates the workdir on a first deploy). `--dry-run` is one preflight exec.
"""

from __future__ import annotations

import base64
import contextlib
import getpass
import hashlib
import os
import posixpath
import secrets
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from launcher import __version__
from launcher import protocol as p
from launcher.agentclient import AgentClient, AgentFailure
from launcher.config import Target
from launcher.container import Container, HostConnection, PushFailed
from launcher.errors import (
    ExitCode,
    LauncherError,
    UsageError,
)
from launcher.fleet import FleetContext, Outcome
from launcher.localhistory import append_local_history
from launcher.ui import step_line

CheckpointMode = Literal["archive", "purge", "keep"]
DISK_MARGIN = 16 * 1024 * 1024
# Scripts up to this size travel inside the transaction's request; larger ones via `pct push`.
INLINE_LIMIT = 4 * 1024 * 1024


@dataclass(frozen=True)
class DeployOptions:
    restart: bool = False
    dry_run: bool = False
    checkpoint_mode: CheckpointMode = "archive"
    grace: float | None = None
    # Kill GPU holders that are not part of the old run instead of refusing (exit 4).
    kill_gpu_holders: bool = False
    # A multi-node job (launcher.job): the run id every node records, and the job's name.
    run_id: str | None = None
    job: str | None = None


@dataclass(frozen=True)
class Step:
    name: str
    status: str  # ok | unchanged | skipped | failed | planned | warning
    detail: str


@dataclass
class DeployReport:
    """A deploy that went through (a failed one raises a LauncherError instead)."""

    target: str
    steps: list[Step] = field(default_factory=list)
    sha256: str = ""
    result: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "ok": True,
            "exit_code": 0,
            "error": None,
            "sha256": self.sha256,
            "steps": [step.__dict__ for step in self.steps],
            "result": self.result,
        }


StepSink = Callable[[Step], None]


def operator_info() -> p.Operator:
    """Who is acting, recorded in the container's lock."""
    return {"user": getpass.getuser(), "host": socket.gethostname(), "pid": os.getpid()}


def deploy(
    target: Target,
    conn: HostConnection,
    options: DeployOptions,
    *,
    on_step: StepSink = lambda step: None,
) -> DeployReport:
    """Deploy the target's playbook, reporting each step; failures raise LauncherError."""
    report = DeployReport(target=target.name)

    def emit(name: str, status: str, detail: str) -> None:
        step = Step(name, status, detail)
        if status != "progress":  # a countdown line is shown, not part of the report
            report.steps.append(step)
        on_step(step)

    playbook = target.playbook
    spec = playbook.spec
    script = read_script(target)
    report.sha256 = hashlib.sha256(script).hexdigest()
    container = Container(conn, target.vmid, label=target.label)
    grace = spec.stop_grace if options.grace is None else options.grace

    if options.dry_run:
        # The transaction itself in plan mode: every check the deploy would run, nothing changed.
        request = plan_request(target, script, options, grace)
        run_transaction(container, request, emit, timeout=conn.endpoint.command_timeout)
        return report

    # The transaction runs every check before its first change (disk, GPUs, tmux, lock, active
    # session, sha256, py_compile, checkpoints), so one `pct exec` is the whole deploy. A script
    # too large to travel inline is pushed first with `pct push` (its sha256 is checked the same).
    inline = len(script) <= INLINE_LIMIT
    ct_tmp: str | None = None
    if inline:
        emit("upload", "ok", f"{len(script)} bytes inline with the transaction (sha256 checked)")
    else:
        ct_tmp = _temp_name(spec.workdir, playbook.dest_path)
        try:
            container.push(script, ct_tmp)
        except PushFailed:
            # First deploy: the workdir does not exist yet. Preflight creates it, then push again.
            preflight(target, container, need_bytes(script), create_workdir=True)
            _upload_again(container, script, ct_tmp)
        emit("upload", "ok", f"{len(script)} bytes pushed to {ct_tmp} (sha256 checked next)")

    request = deploy_request(target, script, options, grace, inline=inline)
    request["tmp"] = ct_tmp
    applied = run_transaction(
        container, request, emit, timeout=grace + conn.endpoint.command_timeout
    )
    report.result = {
        key: applied.get(key) for key in ("script", "stopped", "checkpoints", "launched")
    }
    append_local_history(target.name, applied.get("record") or request["record"])
    return report


def preflight(
    target: Target,
    container: Container,
    need_bytes: int,
    *,
    create_workdir: bool,
    timeout: float | None = None,
) -> p.PreflightAnswer:
    """The agent's preflight: what the container has, and (on request) a created workdir."""
    spec = target.playbook.spec
    request: p.PreflightRequest = {
        "op": "preflight",
        "workdir": spec.workdir,
        "dest": spec.script.dest,
        "session": spec.session,
        "checkpoints": spec.checkpoints,
        "gpus": spec.gpus,
        "need_bytes": need_bytes,
        "create_workdir": create_workdir,
        "lock_path": p.LOCK_PATH,
    }
    return AgentClient(container).preflight(request, timeout=timeout)


def _temp_name(workdir: str, dest_path: str) -> str:
    """A unique temp name in workdir (which preflight created), so the final mv is a rename."""
    name = posixpath.basename(dest_path)
    return posixpath.join(workdir, f".{name}.launcher-{secrets.token_hex(6)}.tmp")


def _upload_again(container: Container, script: bytes, ct_tmp: str) -> None:
    """The second and last try; a failed push may leave part of the file in the container."""
    try:
        container.push(script, ct_tmp)
    except PushFailed:
        with contextlib.suppress(LauncherError):
            container.exec(["rm", "-f", "--", ct_tmp], timeout=30)
        raise


def need_bytes(script: bytes) -> int:
    """Free space a deploy needs in the workdir: the new script, its .prev copy and a margin."""
    return len(script) * 2 + DISK_MARGIN


def deploy_request(
    target: Target, script: bytes, options: DeployOptions, grace: float, *, inline: bool = True
) -> p.TransactionRequest:
    """The deploy transaction for `script`: inline, or (not inline) pushed to `tmp` first."""
    request = transaction_request(
        target,
        op="apply",
        restart=options.restart,
        grace=grace,
        mode=options.checkpoint_mode,
        kill_gpu_holders=options.kill_gpu_holders,
    )
    request.update(
        {
            "content_b64": base64.b64encode(script).decode("ascii") if inline else None,
            "sha256": hashlib.sha256(script).hexdigest(),
            "check_resources": True,
            "need_bytes": need_bytes(script),
        }
    )
    if options.run_id is not None:
        request["run_id"] = options.run_id
    if options.job is not None:
        request["record"]["job"] = options.job
    return request


def plan_request(
    target: Target,
    script: bytes,
    options: DeployOptions,
    grace: float,
    *,
    keep_going: bool = False,
) -> p.TransactionRequest:
    """The deploy transaction in plan mode: every check, nothing changed (dry run, doctor)."""
    request = deploy_request(target, script, options, grace)
    request.update({"plan": True, "keep_going": keep_going})
    return request


def read_script(target: Target) -> bytes:
    """The script's bytes; an unreadable file is a usage error naming it, not a traceback."""
    source = target.playbook.script_source
    try:
        return source.read_bytes()
    except OSError as exc:
        raise UsageError(
            f"{target.playbook.path}: script.source {source} cannot be read: {exc.strerror or exc}"
        ) from None


def transaction_request(
    target: Target,
    *,
    op: str,
    restart: bool,
    grace: float,
    mode: CheckpointMode,
    kill_gpu_holders: bool = False,
) -> p.TransactionRequest:
    """The agent request shared by `apply` (deploy) and `rollback`: one locked transaction."""
    playbook = target.playbook
    spec = playbook.spec
    return {
        "op": op,
        "workdir": spec.workdir,
        "dest": spec.script.dest,
        "session": spec.session,
        "restart": restart,
        "kill_gpu_holders": kill_gpu_holders,
        "grace": grace,
        "checkpoints": spec.checkpoints,
        "checkpoint_mode": mode,
        "keep_archives": spec.keep_archives,
        "command": spec.command,
        "env": spec.env,
        "width": p.PANE_WIDTH,
        "height": p.PANE_HEIGHT,
        "history_limit": p.HISTORY_LIMIT,
        "gpus": spec.gpus,
        "lock_path": p.LOCK_PATH,
        "operator": operator_info(),
        "record": {
            "time": datetime.now(UTC).isoformat(timespec="seconds"),
            "operator": f"{getpass.getuser()}@{socket.gethostname()}",
            "launcher_version": __version__,
            "playbook": spec.name,
            "command": spec.command,
            "target": target.name,
            "script": playbook.dest_path,
        },
    }


def run_transaction(
    container: Container,
    request: p.TransactionRequest,
    emit: Callable[[str, str, str], None],
    *,
    timeout: float,
) -> p.TransactionAnswer:
    """Run the transaction in the container, reporting each step as it happens (the agent
    streams them; the stop's grace countdown comes as `progress` lines), also on a failure."""
    shown = 0

    def on_event(event: dict[str, Any]) -> None:
        nonlocal shown
        if event.get("event") == "step" and isinstance(event.get("step"), dict):
            step = event["step"]
            shown += 1
            emit(str(step.get("name", "?")), str(step.get("status", "?")), str(step.get("detail")))
        elif event.get("event") == "progress":
            emit(str(event.get("name", "?")), "progress", str(event.get("detail", "")))

    try:
        applied = AgentClient(container).transaction(request, timeout=timeout, on_event=on_event)
    except AgentFailure as failure:
        _emit_agent_steps(failure.response.get("steps") or [], shown, emit)
        raise
    _emit_agent_steps(applied.get("steps") or [], shown, emit)
    for warning in applied["warnings"]:
        emit("warning", "warning", str(warning))
    return applied


def _emit_agent_steps(
    steps: list[p.Step], shown: int, emit: Callable[[str, str, str], None]
) -> None:
    """The answer's steps that were not streamed already (all of them from a host that cannot
    stream)."""
    for step in steps[shown:]:
        emit(step.get("name", "?"), step.get("status", "?"), step.get("detail", ""))


def deploy_work(options: DeployOptions) -> Callable[[FleetContext], Outcome]:
    """Deploy as a fleet workflow: step lines go to the target's output, the report to the row."""

    def work(ctx: FleetContext) -> Outcome:
        target = ctx.target

        def show(step: Step) -> None:
            ctx.say(step_line(step.name, step.status, step.detail))

        report = deploy(target, ctx.conn, options, on_step=show)
        if options.dry_run:
            summary = f"dry run: nothing was changed on {target.label}"
        else:
            summary = f"deployed {target.label}: sha256 {report.sha256[:12]}"
        return Outcome(target.name, ExitCode.OK, summary, report.to_json())

    return work
