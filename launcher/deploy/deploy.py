"""The deploy workflow: the script and one locked transaction in the container.

pct invocations: one exec, the transaction (agent/deploy.py), which receives the script
inline, checks its sha256 and everything else that could stop the deploy, and only then changes
things. A script over INLINE_LIMIT is pushed first (`pct push` to a temp name in workdir, plus a
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
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Literal

from launcher.agent import protocol as p
from launcher.config.models import SCRIPT_LIMIT, Target
from launcher.container.agentclient import AgentClient, AgentFailure
from launcher.container.pct import Container, HostConnection, PushFailed
from launcher.core.bounded import read_regular
from launcher.core.errors import (
    ExitCode,
    LauncherError,
    UsageError,
)
from launcher.core.requests import DeployOptions
from launcher.core.version import __version__
from launcher.deploy.localhistory import append_local_history
from launcher.deploy.provenance import source_of
from launcher.targets.fleet import Outcome
from launcher.targets.workflow import Context, Step, StepSink

if TYPE_CHECKING:
    from launcher.deploy.releases import PreparedRelease

# A rollback may also restore: the put-back run's archived checkpoints moved back in place.
TransactionMode = Literal["archive", "purge", "keep", "restore"]
DISK_MARGIN = 16 * 1024 * 1024
# Scripts up to this size travel inside the transaction's request; larger ones via `pct push`.
INLINE_LIMIT = 4 * 1024 * 1024


@dataclass
class DeployReport:
    """A deploy that went through (a failed one raises a LauncherError instead)."""

    target: str
    steps: list[Step] = field(default_factory=list)
    sha256: str = ""
    result: dict[str, Any] = field(default_factory=dict)
    summary: str = ""  # one line: what was deployed where (a fleet table's row)

    @property
    def exit_code(self) -> ExitCode:
        return ExitCode.OK

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


EmitFn = Callable[[str, str, str], None]


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

    target = apply_overrides(target, options)
    playbook = target.playbook
    spec = playbook.spec
    script = read_script(target) if playbook.script_source is not None else None
    report.sha256 = hashlib.sha256(script).hexdigest() if script is not None else ""
    container = Container(conn, target.vmid, label=target.label)
    grace = spec.stop_grace if options.grace is None else options.grace
    prepared = None
    if spec.project is not None:
        from launcher.deploy import releases  # a project's modules load only for a project

        prepared = releases.prepare(
            target,
            container,
            emit,
            timeout=conn.endpoint.command_timeout,
            diff=options.diff,
            plan=options.dry_run,
        )
        report.result["release"] = prepared.summary

    if options.dry_run:
        # The transaction itself in plan mode: every check the deploy would run, nothing changed.
        # A person's dry run (not a job's check phase) shows the plan past an active run.
        request = plan_request(target, script, options, grace)
        request["preview"] = options.job is None
        if prepared is not None:
            request["release"] = prepared.spec
        run_transaction(container, request, emit, timeout=conn.endpoint.command_timeout)
        return report

    # The transaction runs every check before its first change (disk, GPUs, tmux, lock, active
    # session, sha256, py_compile, checkpoints), so one `pct exec` is the whole deploy. A script
    # too large to travel inline is pushed first with `pct push` (its sha256 is checked the same).
    inline = script is None or len(script) <= INLINE_LIMIT
    ct_tmp: str | None = None
    if script is not None and not inline:
        ct_tmp = _temp_name(spec.workdir, str(playbook.dest_path))
        # pct push creates no directory, and on a real node a push into a missing one exits 0
        # having written nothing: the workdir is made (preflight) before the first push.
        preflight(target, container, need_bytes(script), create_workdir=True)
        _upload(container, script, ct_tmp)
        emit("upload", "ok", f"{len(script)} bytes pushed to {ct_tmp}, size and sha256 checked")
    if prepared is not None:
        _send_release(target, container, prepared, emit)

    request = deploy_request(target, script, options, grace, inline=inline)
    request["tmp"] = ct_tmp
    sent = script is None or not inline

    def emit_sent(name: str, status: str, detail: str) -> None:
        # The inline script is shown as sent once the container answers, not before the
        # connection (an unknown host key, a stopped CT) could have failed.
        nonlocal sent
        if not sent:
            sent = True
            emit("upload", "ok", f"{len(script or b'')} bytes sent with the transaction")
        emit(name, status, detail)

    setup_time = 0.0
    if prepared is not None:
        request["release"] = prepared.spec
        setup = prepared.spec.get("setup")
        setup_time = float(setup["timeout"]) if setup else 0.0  # the agent's own limit for it
    applied = run_transaction(
        container,
        request,
        emit_sent,
        timeout=grace + options.wait_lock + setup_time + conn.endpoint.command_timeout,
    )
    report.result.update(
        {key: applied.get(key) for key in ("script", "stopped", "checkpoints", "launched")}
    )
    # The run this one replaced: what a rollback on failure puts back.
    report.result["replaced"] = (applied.get("record") or {}).get("replaced")
    if prepared is not None:
        report.result["release"].update(applied.get("release") or {})
    append_local_history(target.name, applied.get("record") or request["record"])
    return report


def _send_release(
    target: Target, container: Container, prepared: PreparedRelease, emit: EmitFn
) -> None:
    """The missing files' stream: inline with the transaction, or pushed first when large."""
    from launcher.deploy import releases

    workdir = target.playbook.spec.workdir
    need = int(prepared.summary.get("missing_bytes") or 0) + DISK_MARGIN

    def make_workdir() -> None:
        preflight(target, container, need, create_workdir=True)

    where = releases.send_stream(prepared, container, workdir, INLINE_LIMIT, make_workdir)
    how = f"pushed to {where}" if where else "inline with the transaction"
    sent = prepared.sent
    emit(
        "upload",
        "ok",
        f"{sent.files} file(s) sent, {sent.raw_bytes} bytes "
        f"({sent.bytes} compressed) {how}; the rest is in the container",
    )


def apply_overrides(target: Target, options: DeployOptions) -> Target:
    """The target with this deploy's --env, --set and --command applied, validated as the
    playbook is (a bad value is a usage error naming the key)."""
    if not (options.env or options.sets or options.command):
        return target
    import dataclasses

    import yaml
    from pydantic import ValidationError

    from launcher.config.models import PlaybookSpec

    data = target.playbook.spec.model_dump(exclude_unset=False, by_alias=True)
    for item in options.sets:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--set {item!r}: write KEY=VALUE, e.g. verify.wait=60")
        where: dict[str, Any] = data
        parts = key.split(".")
        for part in parts[:-1]:
            child = where.get(part)
            if not isinstance(child, dict):
                raise UsageError(f"--set {item!r}: {part!r} is not a section of the playbook")
            where = child
        if parts[-1] not in where:
            raise UsageError(f"--set {item!r}: the playbook has no key {key!r}")
        where[parts[-1]] = yaml.safe_load(raw) if raw else ""
    data["env"] = {**data.get("env", {}), **options.env}
    if options.command is not None:
        data["command"] = options.command
    try:
        spec = PlaybookSpec.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where_text = ".".join(str(x) for x in first["loc"])
        raise UsageError(f"override {where_text}: {first['msg']}") from None
    playbook = dataclasses.replace(target.playbook, spec=spec)
    return dataclasses.replace(target, playbook=playbook)


REDACTED = "<redacted>"


def override_record(options: DeployOptions) -> dict[str, Any]:
    """What this deploy changed and why, for history. --env values stay out of it (they may be
    secrets; they reach the run through its 0600 run file): their names are recorded, and so
    is a `--set env.NAME=...` as `env.NAME=<redacted>`. `overrides` holds all of them together
    (with the message); the flat keys are kept for older readers."""
    record: dict[str, Any] = {}
    sets = [redact_set(item) for item in options.sets]
    if options.env:
        record["env"] = sorted(options.env)
    if sets:
        record["set"] = sets
    if options.command is not None:
        record["command"] = options.command
    record["overrides"] = {
        "env": sorted(options.env),
        "set": sets,
        "command": options.command,
        "message": options.message,
    }
    return record


def redact_set(item: str) -> str:
    """A `--set` as history records it: an env value (`env.NAME=value`) may be a secret."""
    key, sep, _ = item.partition("=")
    return f"{key}={REDACTED}" if sep and key.strip().startswith("env.") else item


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
        # A project without a script: dest names `current`, which preflight only looks at.
        "dest": spec.script.dest if spec.script is not None else p.CURRENT_LINK,
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


def _upload(container: Container, script: bytes, ct_tmp: str) -> None:
    """The script pushed and checked in the container; a failed push may leave part of the
    file there, removed before the error goes up."""
    try:
        container.push(script, ct_tmp)
    except PushFailed:
        with contextlib.suppress(LauncherError):
            container.exec(["rm", "-f", "--", ct_tmp], timeout=30)
        raise


def need_bytes(script: bytes | None) -> int:
    """Free space a deploy needs in the workdir: the new script, its .prev copy and a margin."""
    return (len(script) * 2 if script is not None else 0) + DISK_MARGIN


def deploy_request(
    target: Target,
    script: bytes | None,
    options: DeployOptions,
    grace: float,
    *,
    inline: bool = True,
) -> p.TransactionRequest:
    """The deploy transaction for `script`: inline, or (not inline) pushed to `tmp` first."""
    request = transaction_request(
        target,
        op="apply",
        restart=options.restart,
        grace=grace,
        mode=options.checkpoint_mode,
        kill_gpu_holders=options.kill_gpu_holders,
        prune_archives=options.prune_archives,
    )
    request["record"].update(override_record(options))
    source = target.playbook.project_source or target.playbook.script_source
    provenance = source_of(source) if source is not None else None
    if provenance is not None:
        request["record"]["source"] = provenance
    if options.message:
        request["record"]["message"] = options.message
    request.update(
        {
            "content_b64": (
                base64.b64encode(script).decode("ascii") if inline and script is not None else None
            ),
            "sha256": hashlib.sha256(script).hexdigest() if script is not None else None,
            "check_resources": True,
            "need_bytes": need_bytes(script),
            "wait_lock": options.wait_lock,
            "expect_run": options.expect_run,
        }
    )
    if options.run_id is not None:
        request["run_id"] = options.run_id
    if options.job is not None:
        request["record"]["job"] = options.job
    if options.rollback_on_failure:
        request["rollback_guard"] = True
        # A watcher leaves this run's failure to the deploy (launcher.watch.monitor).
        request["record"]["rollback_on_failure"] = True
    return request


def plan_request(
    target: Target,
    script: bytes | None,
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
    if source is None:
        raise UsageError(f"{target.playbook.path}: the playbook has no script")
    try:
        return read_regular(source, SCRIPT_LIMIT)
    except OSError as exc:
        raise UsageError(
            f"{target.playbook.path}: script.source {source} cannot be read: {exc.strerror or exc}"
        ) from None


def transaction_request(
    target: Target,
    *,
    op: Literal["apply", "rollback"],
    restart: bool,
    grace: float,
    mode: TransactionMode,
    kill_gpu_holders: bool = False,
    prune_archives: bool = False,
) -> p.TransactionRequest:
    """The agent request shared by `apply` (deploy) and `rollback`: one locked transaction."""
    playbook = target.playbook
    spec = playbook.spec
    return {
        "op": op,
        "workdir": spec.workdir,
        "dest": spec.script.dest if spec.script is not None else None,
        "session": spec.session,
        "restart": restart,
        "kill_gpu_holders": kill_gpu_holders,
        "grace": grace,
        "checkpoints": spec.checkpoints,
        "checkpoint_mode": mode,
        "keep_archives": spec.keep_archives,
        "prune_archives": prune_archives,
        "command": spec.command,
        "env": spec.env,
        "width": p.PANE_WIDTH,
        "height": p.PANE_HEIGHT,
        "history_limit": p.HISTORY_LIMIT,
        "gpus": spec.gpus,
        "lock_path": p.LOCK_PATH,
        "operator": operator_info(),
        "record": {
            "time": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "operator": f"{getpass.getuser()}@{socket.gethostname()}",
            # Who acted and from which machine (the client's, not the container's).
            "user": getpass.getuser(),
            "client_host": socket.gethostname(),
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


def run_deploy(ctx: Context, request: DeployOptions) -> DeployReport:
    """`launcher deploy` on the context's target: steps to the context as they happen."""
    target = ctx.target
    report = deploy(target, ctx.conn, request, on_step=ctx.step)
    if request.dry_run:
        report.summary = f"dry run: nothing was changed on {target.label}"
        if any(s.name == "active_check" and s.status == "warning" for s in report.steps):
            report.summary += "; a deploy needs --restart (the run is active)"
    elif "release" in report.result:
        info = report.result["release"]
        report.summary = (
            f"deployed {target.label}: release {info.get('id')} (manifest "
            f"{str(info.get('manifest_sha256'))[:12]}), {info.get('sent_files')} file(s) sent"
        )
    else:
        report.summary = f"deployed {target.label}: sha256 {report.sha256[:12]}"
    return report


def deploy_row(ctx: Context, report: DeployReport) -> Outcome:
    """A deploy's row of a fleet's table; its JSON item is the report's."""
    return Outcome(
        ctx.target.name, report.exit_code, report.summary, report.to_json(), value=report
    )
