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
from launcher.agentcall import AgentFailure, call_agent
from launcher.config import Target
from launcher.container import Container, PushFailed
from launcher.errors import (
    ContainerError,
    ExitCode,
    LauncherError,
    RefusedError,
    UnsafePathError,
)
from launcher.fleet import FleetContext, Outcome
from launcher.history import append_local_history
from launcher.remote import Connection
from launcher.ui import step_line

CheckpointMode = Literal["archive", "purge", "keep"]
DISK_MARGIN = 16 * 1024 * 1024
# Scripts up to this size travel inside the transaction's request; larger ones via `pct push`.
INLINE_LIMIT = 4 * 1024 * 1024
PANE_WIDTH = 250
PANE_HEIGHT = 50
HISTORY_LIMIT = 100_000


@dataclass(frozen=True)
class DeployOptions:
    restart: bool = False
    dry_run: bool = False
    checkpoint_mode: CheckpointMode = "archive"
    grace: float | None = None


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


def operator_info() -> dict[str, Any]:
    """Who is acting, recorded in the container's lock."""
    return {"user": getpass.getuser(), "host": socket.gethostname(), "pid": os.getpid()}


def deploy(
    target: Target,
    conn: Connection,
    options: DeployOptions,
    *,
    on_step: StepSink = lambda step: None,
) -> DeployReport:
    """Deploy the target's playbook, reporting each step; failures raise LauncherError."""
    report = DeployReport(target=target.name)

    def emit(name: str, status: str, detail: str) -> None:
        step = Step(name, status, detail)
        report.steps.append(step)
        on_step(step)

    playbook = target.playbook
    spec = playbook.spec
    script = playbook.script_source.read_bytes()
    report.sha256 = hashlib.sha256(script).hexdigest()
    container = Container(conn, target.vmid, label=target.label)
    grace = spec.stop_grace if options.grace is None else options.grace

    if options.dry_run:
        pre = preflight(target, container, len(script), create_workdir=False)
        _judge_preflight(target, pre, options, len(script), emit)
        unchanged = pre.get("dest_sha256") == report.sha256
        for name, detail in plan(target, options, pre, unchanged, grace):
            emit(name, "planned", detail)
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
            pre = preflight(target, container, len(script), create_workdir=True)
            _judge_preflight(target, pre, options, len(script), emit)
            _upload_again(container, script, ct_tmp)
        emit("upload", "ok", f"{len(script)} bytes pushed to {ct_tmp} (sha256 checked next)")

    request = transaction_request(
        target, op="apply", restart=options.restart, grace=grace, mode=options.checkpoint_mode
    )
    request.update(
        {
            "tmp": ct_tmp,
            "content_b64": base64.b64encode(script).decode("ascii") if inline else None,
            "sha256": report.sha256,
            "check_resources": True,
            "need_bytes": len(script) * 2 + DISK_MARGIN,
        }
    )
    applied = run_transaction(
        container, request, emit, timeout=grace + conn.endpoint.command_timeout
    )
    report.result = {
        key: applied.get(key) for key in ("script", "stopped", "checkpoints", "launched")
    }
    append_local_history(target.name, applied.get("record") or request["record"])
    return report


LOCK_PATH = "/run/launcher/deploy.lock"


def preflight(
    target: Target,
    container: Container,
    need_bytes: int,
    *,
    create_workdir: bool,
    timeout: float | None = None,
) -> dict[str, Any]:
    """The agent's preflight: what the container has, and (on request) a created workdir."""
    spec = target.playbook.spec
    return call_agent(
        container,
        {
            "op": "preflight",
            "workdir": spec.workdir,
            "dest": spec.script.dest,
            "session": spec.session,
            "checkpoints": spec.checkpoints,
            "gpus": spec.gpus,
            "need_bytes": need_bytes,
            "create_workdir": create_workdir,
            "lock_path": LOCK_PATH,
        },
        timeout=timeout,
    )


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


def _judge_preflight(
    target: Target,
    pre: dict[str, Any],
    options: DeployOptions,
    need_bytes: int,
    emit: Callable[[str, str, str], None],
) -> None:
    spec = target.playbook.spec
    label = target.label
    if not pre.get("tmux"):
        raise ContainerError(
            f"{label}: tmux is not installed in the container",
            hint="install it there: apt-get install tmux",
        )
    workdir = pre.get("workdir") or {}
    if not workdir.get("writable"):
        raise ContainerError(f"{label}: workdir {spec.workdir} cannot be created or written")
    free = int(pre.get("free_bytes") or 0)
    if free < need_bytes * 2 + DISK_MARGIN:
        raise ContainerError(f"{label}: only {free} bytes free under {spec.workdir}")
    unsafe = (pre.get("checkpoints") or {}).get("unsafe")
    if unsafe:
        raise UnsafePathError(f"{label}: checkpoints path refused: {unsafe}")
    gpus = pre.get("gpus") or {}
    if spec.gpus > 0:
        visible = int(gpus.get("visible") or 0)
        if visible < spec.gpus:
            reason = gpus.get("error") or f"{visible} visible"
            raise ContainerError(f"{label}: playbook wants {spec.gpus} GPUs, {reason}")
    lock = pre.get("lock")
    if lock and not lock.get("stale"):
        raise RefusedError(f"{label}: another deploy is running: {_holder(lock)}")
    session = pre.get("session") or {}
    active = bool(session.get("exists")) and not session.get("pane_dead")
    if active and not options.restart:
        raise RefusedError(
            f"{label}: session '{spec.session}' is running; use --restart to replace it",
        )
    detail = f"python {pre.get('python')}, {pre.get('tmux')}, {free // (1024 * 1024)} MiB free"
    if spec.gpus > 0:
        detail += f", {gpus.get('visible')} GPUs"
        holders = gpus.get("holders") or []
        if holders and options.restart:
            pids = ", ".join(f"{h.get('pid')} {h.get('name')}" for h in holders)
            detail += f" (held by {pids})"
    emit("preflight", "ok", detail)


def _holder(lock: dict[str, Any]) -> str:
    return (
        f"{lock.get('operator')} from {lock.get('from_host')} "
        f"(pid {lock.get('client_pid')}, since {lock.get('since')})"
    )


def plan(
    target: Target, options: DeployOptions, pre: dict[str, Any], unchanged: bool, grace: float
) -> list[tuple[str, str]]:
    """What a deploy would do, step by step, from the preflight's view of the container."""
    pb = target.playbook
    spec = pb.spec
    session = pre.get("session") or {}
    steps = [
        (
            "connect",
            f"{target.host.user}@{target.host.address}:{target.host.port}, CT {target.vmid}",
        ),
        (
            "upload",
            f"{pb.script_source} -> {pb.dest_path} "
            + ("(unchanged, skipped)" if unchanged else "(sha256 + py_compile checked, then mv)"),
        ),
    ]
    if session.get("exists"):
        if options.restart:
            steps.append(
                (
                    "stop",
                    f"session '{spec.session}' (pane pid {session.get('pane_pid')}): "
                    f"C-c, wait {grace:g} s, kill session and leftover processes",
                )
            )
    else:
        steps.append(("stop", f"nothing to stop: no session '{spec.session}'"))
    ckpt = pre.get("checkpoints") or {}
    if not ckpt.get("exists"):
        steps.append(("checkpoints", f"nothing to set aside at {pb.checkpoints_path}"))
    elif options.checkpoint_mode == "archive":
        steps.append(
            (
                "checkpoints",
                f"move {pb.checkpoints_path} to "
                f"{pb.checkpoints_path}.archived-<UTC time>, keep {spec.keep_archives}",
            )
        )
    elif options.checkpoint_mode == "purge":
        steps.append(("checkpoints", f"DELETE {pb.checkpoints_path}"))
    else:
        steps.append(("checkpoints", f"keep {pb.checkpoints_path} for a resume"))
    steps.append(("launch", f"tmux session '{spec.session}' in {spec.workdir}: {spec.command}"))
    steps.append(("record", f"{spec.workdir}/.launcher/deploys.jsonl and the local history"))
    return steps


def transaction_request(
    target: Target, *, op: str, restart: bool, grace: float, mode: CheckpointMode
) -> dict[str, Any]:
    """The agent request shared by `apply` (deploy) and `rollback`: one locked transaction."""
    playbook = target.playbook
    spec = playbook.spec
    return {
        "op": op,
        "workdir": spec.workdir,
        "dest": spec.script.dest,
        "session": spec.session,
        "restart": restart,
        "grace": grace,
        "checkpoints": spec.checkpoints,
        "checkpoint_mode": mode,
        "keep_archives": spec.keep_archives,
        "command": spec.command,
        "env": spec.env,
        "width": PANE_WIDTH,
        "height": PANE_HEIGHT,
        "history_limit": HISTORY_LIMIT,
        "gpus": spec.gpus,
        "lock_path": LOCK_PATH,
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
    request: dict[str, Any],
    emit: Callable[[str, str, str], None],
    *,
    timeout: float,
) -> dict[str, Any]:
    """Run the transaction in the container, reporting its steps (also those of a failure)."""
    try:
        applied = call_agent(container, request, timeout=timeout)
    except AgentFailure as failure:
        _emit_agent_steps(failure.response, emit)
        raise
    _emit_agent_steps(applied, emit)
    for warning in applied.get("warnings") or []:
        emit("warning", "warning", str(warning))
    return applied


def _emit_agent_steps(response: dict[str, Any], emit: Callable[[str, str, str], None]) -> None:
    for step in response.get("steps") or []:
        emit(str(step.get("name")), str(step.get("status")), str(step.get("detail", "")))


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
