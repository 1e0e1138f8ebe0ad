"""Day-two workflows on a running target: logs, stop, attach, history, rollback.

Each takes (target, connection, ...) and returns a small result with `exit_code` and a one-line
`summary` (for fleet tables) plus the details. Expected outcomes (no session, nothing to show)
are results; failures to reach or act on the target propagate as LauncherError, as in deploy.
Every container op is one `pct exec` of the agent; `logs --follow` streams over one more.
"""

from __future__ import annotations

import codecs
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from launcher.agentcall import BOOT, ERROR_KINDS, agent_source, call_agent
from launcher.config import Target
from launcher.container import exec_command
from launcher.deploy import (
    LOCK_PATH,
    Step,
    operator_info,
    run_transaction,
    transaction_request,
)
from launcher.errors import ExitCode, RemoteError
from launcher.history import append_local_history
from launcher.remote import Connection, Endpoint
from launcher.runops import container_for, poll_once

LineSink = Callable[[str], None]
StepSink = Callable[[Step], None]

# The agent proves the stream is alive this often; silence for HEARTBEAT_MISSES of them means
# the connection is dead.
HEARTBEAT = 5.0
HEARTBEAT_MISSES = 6


def _ended_text(ended: dict[str, Any] | None) -> str:
    if not ended:
        return "ended"
    if ended.get("exit_code") is not None:
        return f"ended with exit code {ended['exit_code']}"
    return f"ended ({ended.get('reason', 'session gone')})"


# --------------------------------------------------------------------------- logs


@dataclass
class LogsResult:
    exit_code: ExitCode
    summary: str
    source: str  # log | pane
    log_file: str
    lines: list[str] = field(default_factory=list)  # the tail shown before any following
    session: dict[str, Any] = field(default_factory=dict)
    followed: bool = False
    ended: dict[str, Any] | None = None  # how the run ended while followed
    interrupted: bool = False  # Ctrl-C stopped the following (the run goes on)


class LineSplitter:
    """Bytes from a stream in, clean lines out (CR line endings and overwrites resolved)."""

    def __init__(self, on_line: LineSink) -> None:
        self.on_line = on_line
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._buffer = ""

    def feed(self, data: bytes) -> None:
        self._buffer += self._decoder.decode(data)
        *lines, self._buffer = self._buffer.split("\n")
        for line in lines:
            self.on_line(_clean(line))

    def flush(self) -> None:
        self._buffer += self._decoder.decode(b"", final=True)
        if self._buffer:
            self.on_line(_clean(self._buffer))
        self._buffer = ""


def _clean(line: str) -> str:
    line = line.rstrip("\r")
    return line.rpartition("\r")[2]


def logs(
    target: Target,
    conn: Connection,
    *,
    tail: int = 50,
    raw: bool = False,
    follow: bool = False,
    on_line: LineSink = lambda line: None,
    heartbeat: float = HEARTBEAT,
) -> LogsResult:
    """The last `tail` lines of the run's log file (or its pane with `raw`), then with `follow`
    the new lines as they are written until the run ends or Ctrl-C (which never stops the run).
    """
    spec = target.playbook.spec
    container = container_for(target, conn)
    answer = call_agent(
        container,
        {
            "op": "logs",
            "workdir": spec.workdir,
            "session": spec.session,
            "lines": tail,
            "raw": raw,
        },
        timeout=60,
    )
    session = answer.get("session") or {}
    log_file = str(answer.get("log_file") or "")
    lines = [str(line) for line in answer.get("lines") or []]
    result = LogsResult(ExitCode.OK, "", "pane" if raw else "log", log_file, lines, session=session)
    if raw and not session.get("exists"):
        result.exit_code = ExitCode.UNHEALTHY
        result.summary = f"no session '{spec.session}' on {target.label}: no pane to show"
        return result
    if not raw and not answer.get("log_exists"):
        result.exit_code = ExitCode.UNHEALTHY
        where = f"session '{spec.session}' is running" if session.get("exists") else "no session"
        result.summary = f"no log file {log_file} on {target.label} ({where}); try --raw"
        return result
    for line in lines:
        on_line(line)
    partial = str(answer.get("partial") or "")
    running = bool(session.get("exists")) and not session.get("pane_dead")
    running = running and answer.get("exit_code") is None
    if not follow or raw or not running:
        if partial:
            on_line(partial)
        shown = f"last {len(lines) + bool(partial)} lines of {'the pane' if raw else log_file}"
        if follow and not raw:
            state = "no session" if not session.get("exists") else "the run has ended"
            shown += f"; not following: {state}"
        result.summary = shown
        return result
    result.followed = True
    ended, interrupted = _follow(target, conn, int(answer.get("offset") or 0), on_line, heartbeat)
    result.ended, result.interrupted = ended, interrupted
    if interrupted:
        result.summary = f"stopped following {log_file}; the run goes on"
    else:
        result.summary = f"the run {_ended_text(ended)}"
    return result


def _follow(
    target: Target, conn: Connection, offset: int, on_line: LineSink, heartbeat: float
) -> tuple[dict[str, Any] | None, bool]:
    """Stream the log from `offset` over one `pct exec`; returns (how the run ended, Ctrl-C)."""
    spec = target.playbook.spec
    request = {
        "op": "follow",
        "workdir": spec.workdir,
        "session": spec.session,
        "offset": offset,
        "heartbeat": heartbeat,
    }
    payload = json.dumps({"agent": agent_source(), "request": request}) + "\n"
    splitter = LineSplitter(on_line)
    stderr = bytearray()
    try:
        code = conn.stream(
            exec_command(target.vmid, ["python3", "-c", BOOT]),
            splitter.feed,
            on_stderr=stderr.extend,
            stdin=payload.encode(),
            close_stdin=False,  # the agent sees EOF on stdin when we go away
            idle_timeout=heartbeat * HEARTBEAT_MISSES,
        )
    except KeyboardInterrupt:
        splitter.flush()
        return None, True
    splitter.flush()
    text = stderr.decode("utf-8", "replace").strip()
    last = text.splitlines()[-1] if text else ""
    try:
        envelope: dict[str, Any] = json.loads(last) if last.startswith("{") else {}
    except json.JSONDecodeError:
        envelope = {}
    if code != 0 or not envelope:
        detail = "\n".join(text.splitlines()[-5:]) or "no answer"
        raise RemoteError(f"{target.label}: following the log failed (exit {code}): {detail}")
    error = envelope.get("error")
    if not envelope.get("ok") and error:
        kind = ERROR_KINDS.get(str(error.get("kind")), RemoteError)
        raise kind(f"{target.label}: {error.get('message')}")
    return envelope.get("ended"), bool(envelope.get("client_gone"))


# --------------------------------------------------------------------------- stop


@dataclass
class StopResult:
    exit_code: ExitCode
    summary: str
    session: str
    stopped: dict[str, Any] = field(default_factory=dict)
    steps: list[Step] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def stop(target: Target, conn: Connection, *, grace: float | None = None) -> StopResult:
    """The deploy's graceful stop on its own: C-c, wait, kill the session and what is left of
    the run's processes, confirm they (and their GPUs) are gone. Checkpoints are not touched."""
    spec = target.playbook.spec
    wait = spec.stop_grace if grace is None else grace
    answer = call_agent(
        container_for(target, conn),
        {
            "op": "stop",
            "session": spec.session,
            "grace": wait,
            "gpus": spec.gpus,
            "lock_path": LOCK_PATH,
            "operator": operator_info(),
        },
        timeout=wait + 30 + conn.endpoint.command_timeout,
    )
    report: dict[str, Any] = answer.get("stopped") or {}
    result = StopResult(ExitCode.OK, "", spec.session, report)
    result.warnings = [str(w) for w in answer.get("warnings") or []]
    pids = ", ".join(str(p) for p in report.get("pids") or []) or "none"
    if not report.get("session_existed") and not report.get("pids"):
        result.summary = f"no session '{spec.session}' on {target.label}: nothing to stop"
        return result
    how = "forced (C-c was not enough)" if report.get("forced") else "exited after C-c"
    result.steps.append(Step("stop", "ok", f"session {spec.session}: {how}; pids {pids}"))
    leftover = [int(p) for p in report.get("leftover") or []]
    holders = report.get("gpu_holders") or []
    if leftover:
        result.steps.append(
            Step("processes", "failed", "still alive: " + ", ".join(map(str, leftover)))
        )
    else:
        result.steps.append(Step("processes", "ok", "none left"))
    if spec.gpus <= 0:
        result.steps.append(Step("gpus", "skipped", "not checked (playbook gpus: 0)"))
    elif holders:
        held = ", ".join(f"{h.get('pid')} {h.get('name')}" for h in holders)
        result.steps.append(Step("gpus", "failed", f"still held by {held}"))
    else:
        result.steps.append(Step("gpus", "ok", "free"))
    if leftover or holders:
        result.exit_code = ExitCode.UNREACHABLE
        result.summary = f"session '{spec.session}' did not stop completely on {target.label}"
    else:
        result.summary = f"stopped session '{spec.session}' on {target.label} (pids {pids})"
    return result


# --------------------------------------------------------------------------- attach


@dataclass
class AttachResult:
    exit_code: ExitCode
    summary: str
    session: str
    argv: list[str] = field(default_factory=list)  # the ssh client command to exec


def attach_argv(endpoint: Endpoint, vmid: int, session: str) -> list[str]:
    """The system ssh client with a terminal, the host's settings and strict host keys, running
    `tmux attach` inside the container (the remote command is quoted once, by container.py)."""
    argv = ["ssh", "-t", "-p", str(endpoint.port), "-l", endpoint.user]
    for identity in endpoint.identity_files:
        argv += ["-i", identity]
    policy = "accept-new" if endpoint.accept_new else "yes"
    argv += ["-o", f'UserKnownHostsFile="{endpoint.known_hosts}"']
    argv += ["-o", f"StrictHostKeyChecking={policy}"]
    if endpoint.jump:
        argv += ["-o", f"ProxyJump={endpoint.jump}"]
    argv += ["-o", f"ConnectTimeout={max(1, math.ceil(endpoint.connect_timeout))}"]
    remote = exec_command(vmid, ["tmux", "attach", "-t", f"={session}:"])
    return [*argv, "--", endpoint.hostname, remote]


def attach(target: Target, conn: Connection) -> AttachResult:
    """Check (one poll) that the session exists, and say how to attach to it interactively."""
    spec = target.playbook.spec
    state, _ = poll_once(container_for(target, conn), target, 1)
    if not state.session_exists:
        return AttachResult(
            ExitCode.UNHEALTHY,
            f"no session '{spec.session}' on {target.label}: nothing to attach to",
            spec.session,
        )
    argv = attach_argv(conn.endpoint, target.vmid, spec.session)
    note = " (its pane is dead)" if state.pane_dead else ""
    summary = f"attaching to session '{spec.session}' on {target.label}{note}; detach: C-b d"
    return AttachResult(ExitCode.OK, summary, spec.session, argv)


# --------------------------------------------------------------------------- history


@dataclass
class HistoryResult:
    exit_code: ExitCode
    summary: str
    path: str
    records: list[dict[str, Any]] = field(default_factory=list)  # newest first


def history(target: Target, conn: Connection, *, limit: int = 0) -> HistoryResult:
    """The container's deploy records (<workdir>/.launcher/deploys.jsonl), newest first."""
    spec = target.playbook.spec
    answer = call_agent(
        container_for(target, conn),
        {"op": "history", "workdir": spec.workdir, "limit": limit},
        timeout=60,
    )
    records = [r for r in answer.get("records") or [] if isinstance(r, dict)]
    total = int(answer.get("total") or len(records))
    path = str(answer.get("path") or "")
    if not records:
        return HistoryResult(ExitCode.OK, f"no deploys recorded on {target.label}", path)
    latest = records[0]
    summary = (
        f"{total} deploy(s) on {target.label}; latest {latest.get('time')} "
        f"sha256 {str(latest.get('sha256') or '')[:12]} ({latest.get('outcome')})"
    )
    return HistoryResult(ExitCode.OK, summary, path, records)


def history_lines(record: dict[str, Any]) -> list[str]:
    """A deploy record for people: one head line and the details under it."""
    marks = " [rollback]" if record.get("rollback") else ""
    head = (
        f"{record.get('time', '?')}  {record.get('outcome', '?')}  "
        f"sha256 {str(record.get('sha256') or '?')[:12]}  by {record.get('operator', '?')}{marks}"
    )
    lines = [head, f"  command      {record.get('command', '?')}"]
    stopped = record.get("stopped") or {}
    if stopped.get("session_existed") or stopped.get("pids"):
        pids = ", ".join(str(p) for p in stopped.get("pids") or []) or "none"
        how = "forced" if stopped.get("forced") else "C-c"
        lines.append(f"  stopped      pids {pids} ({how})")
    else:
        lines.append("  stopped      nothing was running")
    ckpt = record.get("checkpoints") or {}
    action = ckpt.get("action")
    if action == "archive" and ckpt.get("to"):
        lines.append(f"  checkpoints  moved to {ckpt['to']}")
    elif action == "purge":
        lines.append(f"  checkpoints  deleted {ckpt.get('from')}")
    elif action == "none":
        lines.append("  checkpoints  none to set aside")
    else:
        lines.append("  checkpoints  kept in place")
    return lines


# --------------------------------------------------------------------------- rollback


@dataclass
class RollbackResult:
    exit_code: ExitCode
    summary: str
    sha256: str = ""
    rolled_back_from: str | None = None
    steps: list[Step] = field(default_factory=list)
    result: dict[str, Any] = field(default_factory=dict)


def rollback(
    target: Target,
    conn: Connection,
    *,
    restart: bool = False,
    grace: float | None = None,
    keep_checkpoints: bool = False,
    on_step: StepSink = lambda step: None,
) -> RollbackResult:
    """Put the previous script version (<dest>.prev) back and relaunch, through the same locked
    transaction as deploy (guards, stop, checkpoints, launch, record). No previous version, or
    an active run without `restart`, refuses (exit 4)."""
    spec = target.playbook.spec
    wait = spec.stop_grace if grace is None else grace
    result = RollbackResult(ExitCode.OK, "")

    def emit(name: str, status: str, detail: str) -> None:
        step = Step(name, status, detail)
        result.steps.append(step)
        on_step(step)

    request = transaction_request(
        target,
        op="rollback",
        restart=restart,
        grace=wait,
        mode="keep" if keep_checkpoints else "archive",
    )
    container = container_for(target, conn)
    applied = run_transaction(
        container, request, emit, timeout=wait + conn.endpoint.command_timeout
    )
    saved = applied.get("record") or request["record"]
    result.sha256 = str(saved.get("sha256") or "")
    result.rolled_back_from = saved.get("rolled_back_from")
    result.result = {k: applied.get(k) for k in ("script", "stopped", "checkpoints", "launched")}
    append_local_history(target.name, saved)
    was = (result.rolled_back_from or "?")[:12]
    result.summary = f"rolled back {target.label}: sha256 {result.sha256[:12]} (was {was})"
    return result


def _emit_steps(response: dict[str, Any], emit: Callable[[str, str, str], None]) -> None:
    for step in response.get("steps") or []:
        emit(str(step.get("name")), str(step.get("status")), str(step.get("detail", "")))
