"""Day-two workflows on a running target: logs, stop, attach, history, rollback.

Each takes (target, connection, ...) and returns a small result with `exit_code` and a one-line
`summary` (for fleet tables) plus the details. Expected outcomes (no session, nothing to show)
are results; failures to reach or act on the target propagate as LauncherError, as in deploy.
Every container op is one `pct exec` of the agent; `logs --follow` streams over one more.
"""

from __future__ import annotations

import codecs
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from launcher.agent import protocol as p
from launcher.config.models import Target
from launcher.container.agentclient import AgentClient, container_for
from launcher.container.pct import HostConnection, exec_command
from launcher.core.errors import ExitCode, LauncherError, UsageError
from launcher.core.requests import HistoryRequest, LogsRequest, RollbackRequest, StopRequest
from launcher.deploy.deploy import (
    TransactionMode,
    operator_info,
    run_transaction,
    transaction_request,
)
from launcher.deploy.localhistory import append_local_history
from launcher.deploy.provenance import describe as describe_source
from launcher.deploy.provenance import describe_overrides
from launcher.output.termsafe import Sanitizer, resolve_cr, sanitize
from launcher.probe.poll import poll_once
from launcher.targets.fleet import Outcome
from launcher.targets.workflow import Context, Step
from launcher.transport.endpoint import Endpoint

LineSink = Callable[[str], None]
ByteSink = Callable[[bytes], None]
StepSink = Callable[[Step], None]

# The agent proves the stream is alive this often; silence for HEARTBEAT_MISSES of them means
# the connection is dead.
HEARTBEAT = 5.0
HEARTBEAT_MISSES = 6
# A followed line longer than this (characters) is shown in pieces rather than held in memory.
MAX_LINE = 1 << 20


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

    def to_json(self) -> dict[str, Any]:
        return {
            "exit_code": int(self.exit_code),
            "summary": self.summary,
            "source": self.source,
            "log_file": self.log_file,
            "lines": self.lines,
            "session": self.session,
            "followed": self.followed,
            "ended": self.ended,
            "interrupted": self.interrupted,
        }


def run_logs(ctx: Context, request: LogsRequest) -> LogsResult:
    """`launcher logs` on the context's target."""
    return logs(
        ctx.target,
        ctx.conn,
        tail=request.tail,
        raw=request.raw,
        follow=request.follow,
        on_line=ctx.output,
        raw_bytes=ctx.raw_output,
    )


class LineSplitter:
    """Bytes from a stream in, lines safe for a terminal out (see termsafe).

    A UTF-8 character or an escape sequence cut at the end of one chunk is finished with the
    next; carriage returns are resolved as a terminal would show the line.
    """

    def __init__(self, on_line: LineSink) -> None:
        self.on_line = on_line
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._sanitizer = Sanitizer(keep_cr=True)
        self._partial = ""  # the line being received, without its newline yet

    def feed(self, data: bytes) -> None:
        text = self._sanitizer.feed(self._decoder.decode(data))
        if "\n" not in text:
            partial = self._partial + text
            self._partial = _collapse(partial) if "\r" in text else partial
            if len(self._partial) > MAX_LINE:
                # Never keep an endless line in memory: show it in pieces.
                self.on_line(resolve_cr(self._partial))
                self._partial = ""
            return
        first, *rest = text.split("\n")
        self.on_line(resolve_cr(self._partial + first))
        for line in rest[:-1]:
            self.on_line(resolve_cr(line))
        self._partial = _collapse(rest[-1])

    def flush(self) -> None:
        text = self._decoder.decode(b"", final=True)
        self._partial += self._sanitizer.feed(text) + self._sanitizer.flush()
        if self._partial:
            self.on_line(resolve_cr(self._partial))
        self._partial = ""


def _collapse(partial: str) -> str:
    """A line still being written, its carriage returns applied so that a progress bar that
    redraws itself for hours stays one bar long: what the line shows so far, then CR and the
    text after the last CR again, which puts the cursor where the next text goes."""
    if "\r" not in partial:
        return partial
    return resolve_cr(partial) + "\r" + partial.rpartition("\r")[2]


def logs(
    target: Target,
    conn: HostConnection,
    *,
    tail: int = 50,
    raw: bool = False,
    follow: bool = False,
    on_line: LineSink = lambda line: None,
    heartbeat: float = HEARTBEAT,
    raw_bytes: ByteSink | None = None,
) -> LogsResult:
    """The last `tail` lines of the run's log file (or its pane with `raw`), then with `follow`
    the new lines as they are written until the run ends or Ctrl-C (which never stops the run).

    Lines reach `on_line` sanitised for a terminal (termsafe). With `raw_bytes`, everything goes
    there instead, unfiltered: the tail lines as the agent read them, the followed log byte for
    byte (for a file or a pipe, never a terminal: the CLI checks).
    """
    clean: Callable[[str], str] = sanitize if raw_bytes is None else str

    def emit(line: str) -> None:
        if raw_bytes is None:
            on_line(line)
        else:
            raw_bytes(line.encode("utf-8", "surrogateescape") + b"\n")

    spec = target.playbook.spec
    container = container_for(target, conn)
    request: p.LogsRequest = {
        "op": "logs",
        "workdir": spec.workdir,
        "session": spec.session,
        "lines": tail,
        "raw": raw,
    }
    answer = AgentClient(container).logs(request, timeout=conn.endpoint.command_timeout)
    session = dict(answer["session"])
    log_file = answer["log_file"]
    lines = [clean(str(line)) for line in answer["lines"]]
    result = LogsResult(ExitCode.OK, "", "pane" if raw else "log", log_file, lines, session=session)
    if raw and not session.get("exists"):
        result.exit_code = ExitCode.UNHEALTHY
        result.summary = (
            f"no session '{spec.session}' on {target.label}: no pane to show "
            f"(launcher deploy -t {target.name} starts one)"
        )
        return result
    if not raw and not answer["log_exists"]:
        result.exit_code = ExitCode.UNHEALTHY
        where = f"session '{spec.session}' is running" if session.get("exists") else "no session"
        result.summary = f"no log file {log_file} on {target.label} ({where}); try --raw"
        return result
    for line in lines:
        emit(line)
    partial = clean(str(answer.get("partial") or ""))
    running = bool(session.get("exists")) and not session.get("pane_dead")
    running = running and answer.get("exit_code") is None
    if not follow or raw or not running:
        if partial:
            emit(partial)
        shown = f"last {len(lines) + bool(partial)} lines of {'the pane' if raw else log_file}"
        if follow and not raw:
            state = "no session" if not session.get("exists") else "the run has ended"
            shown += f"; not following: {state}"
        result.summary = shown
        return result
    result.followed = True
    offset = int(answer.get("offset") or 0)
    splitter = LineSplitter(on_line)
    on_data = raw_bytes if raw_bytes is not None else splitter.feed
    try:
        ended, interrupted = _follow(target, conn, offset, on_data, heartbeat)
    except LauncherError:
        splitter.flush()  # the last line without a newline is still worth seeing
        raise
    splitter.flush()
    result.ended, result.interrupted = ended, interrupted
    if interrupted:
        result.summary = f"stopped following {log_file}; the run goes on"
    else:
        result.summary = f"the run {_ended_text(ended)}"
    return result


def _follow(
    target: Target, conn: HostConnection, offset: int, on_data: ByteSink, heartbeat: float
) -> tuple[dict[str, Any] | None, bool]:
    """Stream the log from `offset` over one `pct exec`; returns (how the run ended, Ctrl-C).

    An exception from `on_data` (a closed stdout) ends the stream and propagates unchanged.
    """
    spec = target.playbook.spec
    request: p.FollowRequest = {
        "op": "follow",
        "workdir": spec.workdir,
        "session": spec.session,
        "offset": offset,
        "heartbeat": heartbeat,
        "interval": 0.2,
    }
    try:
        answer = AgentClient(container_for(target, conn)).follow(
            request, on_data, idle_timeout=heartbeat * HEARTBEAT_MISSES
        )
    except KeyboardInterrupt:
        return None, True
    ended = answer["ended"]
    return (dict(ended) if ended else None), bool(answer["client_gone"])


# --------------------------------------------------------------------------- stop


@dataclass
class StopResult:
    exit_code: ExitCode
    summary: str
    session: str
    stopped: dict[str, Any] = field(default_factory=dict)
    steps: list[Step] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def line(self) -> str:
        """The summary as `launcher stop` prints it (and a fleet's row)."""
        stopped_something = bool(self.steps) and not self.exit_code
        return self.summary + ("; checkpoints untouched" if stopped_something else "")

    def to_json(self) -> dict[str, Any]:
        return {
            "exit_code": int(self.exit_code),
            "summary": self.summary,
            "session": self.session,
            "stopped": self.stopped,
            "steps": [step.__dict__ for step in self.steps],
            "warnings": self.warnings,
        }


def run_stop(ctx: Context, request: StopRequest) -> StopResult:
    """`launcher stop` on the context's target: its steps and warnings to the context."""
    result = stop(ctx.target, ctx.conn, grace=request.grace)
    for step in result.steps:
        ctx.step(step)
    for warning in result.warnings:
        ctx.step(Step("warning", "warning", warning))
    return result


def stop_row(ctx: Context, result: StopResult) -> Outcome:
    return Outcome(ctx.target.name, result.exit_code, result.line, value=result)


def stop(
    target: Target,
    conn: HostConnection,
    *,
    grace: float | None = None,
    expect_run: str | None = None,
) -> StopResult:
    """The deploy's graceful stop on its own: C-c, wait, kill the session and what is left of
    the run's processes, confirm they (and their GPUs) are gone. Checkpoints are not touched.
    Only the run `expect_run` names is stopped (None: the one live now, as a poll sees it)."""
    spec = target.playbook.spec
    wait = spec.stop_grace if grace is None else grace
    agent = AgentClient(container_for(target, conn))
    request: p.StopRequest = {
        "op": "stop",
        "workdir": spec.workdir,
        "session": spec.session,
        "grace": wait,
        "gpus": spec.gpus,
        "cuda_visible_devices": spec.env.get("CUDA_VISIBLE_DEVICES", ""),
        "lock_path": p.LOCK_PATH,
        "operator": operator_info(),
        # The run live now is the one this stop is for: one that replaced it meanwhile (a
        # deploy while this request was held up on the way) is not touched.
        "expect_run": expect_run or live_run(agent, target, conn.endpoint.command_timeout),
    }
    answer = agent.stop(request, timeout=wait + 30 + conn.endpoint.command_timeout)
    report: dict[str, Any] = dict(answer["stopped"])
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
    # Not the run's, so not stopped; the GPUs are not free all the same.
    others = report.get("gpu_others") or []
    # Memory still in use on the run's GPUs with no holder here: another CT or the host.
    outside = report.get("gpu_outside") or []
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
    elif others:
        held = ", ".join(f"{h.get('pid')} ({h.get('command') or h.get('name')})" for h in others)
        result.steps.append(Step("gpus", "failed", f"in use by processes outside the run: {held}"))
    elif outside:
        used = ", ".join(f"GPU {d.get('index')} ({d.get('used_mib')} MiB)" for d in outside)
        result.steps.append(
            Step("gpus", "failed", f"still in use from outside this container: {used}")
        )
    else:
        result.steps.append(Step("gpus", "ok", "free"))
    if leftover or holders:
        result.exit_code = ExitCode.UNREACHABLE
        result.summary = f"session '{spec.session}' did not stop completely on {target.label}"
    elif others or outside:
        result.exit_code = ExitCode.UNREACHABLE
        result.summary = (
            f"stopped session '{spec.session}' on {target.label} (pids {pids}), but its GPUs "
            "are still in use by processes outside the run"
            + (" (outside this container)" if outside and not others else "")
        )
    else:
        result.summary = f"stopped session '{spec.session}' on {target.label} (pids {pids})"
    return result


def live_run(agent: AgentClient, target: Target, timeout: float) -> str | None:
    """The run the target's session runs now (its marker; None: a session launcher did not
    start, or none), as one poll sees it."""
    spec = target.playbook.spec
    request: p.PollRequest = {
        "op": "poll",
        "workdir": spec.workdir,
        "session": spec.session,
        "lines": 1,
    }
    return agent.poll(request, timeout=timeout)["session"]["run"]


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
    if endpoint.proxy_command:
        argv += ["-o", f"ProxyCommand={endpoint.proxy_command}"]
    argv += ["-o", f"ConnectTimeout={max(1, math.ceil(endpoint.connect_timeout))}"]
    remote = exec_command(vmid, ["tmux", "attach", "-t", f"={session}:"])
    return [*argv, "--", endpoint.hostname, remote]


def attach(target: Target, conn: HostConnection) -> AttachResult:
    """Check (one poll) that the session exists, and say how to attach to it interactively."""
    spec = target.playbook.spec
    state, _ = poll_once(container_for(target, conn), target, 1)
    if not state.session_exists:
        return AttachResult(
            ExitCode.UNHEALTHY,
            f"no session '{spec.session}' on {target.label}: nothing to attach to "
            f"(launcher deploy -t {target.name} starts one)",
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
    target: str = ""
    diff: dict[str, Any] | None = None  # with --diff A B: what changed (run_diff)

    def to_json(self) -> dict[str, Any]:
        """The target's item of `history --json` (schema launcher.history/1)."""
        document = {
            "target": self.target,
            "exit_code": int(self.exit_code),
            "path": self.path,
            "records": self.records,
        }
        if self.diff is not None:
            document["diff"] = self.diff
        return document


def run_history(ctx: Context, request: HistoryRequest) -> HistoryResult:
    """`launcher history` on the context's target."""
    if request.diff:
        result = history_diff(ctx.target, ctx.conn, request.diff)
    else:
        result = history(ctx.target, ctx.conn, limit=request.limit)
    result.target = ctx.target.name
    return result


def history_row(ctx: Context, result: HistoryResult) -> Outcome:
    return Outcome(
        ctx.target.name, result.exit_code, result.summary, result.to_json(), value=result
    )


def history(target: Target, conn: HostConnection, *, limit: int = 0) -> HistoryResult:
    """The container's deploy records (<workdir>/.launcher/deploys.jsonl), newest first."""
    spec = target.playbook.spec
    request: p.HistoryRequest = {"op": "history", "workdir": spec.workdir, "limit": limit}
    answer = AgentClient(container_for(target, conn)).history(
        request, timeout=conn.endpoint.command_timeout
    )
    records = [r for r in answer["records"] if isinstance(r, dict)]
    total = answer["total"]
    path = answer["path"]
    if not records:
        return HistoryResult(ExitCode.OK, f"no deploys recorded on {target.label}", path)
    latest = records[0]
    summary = (
        f"{total} deploy(s) on {target.label}; latest {latest.get('time')} "
        f"sha256 {str(latest.get('sha256') or '')[:12]} ({latest.get('outcome')})"
    )
    return HistoryResult(ExitCode.OK, sanitize(summary, keep_sgr=False), path, records)


def history_diff(target: Target, conn: HostConnection, runs: tuple[str, ...]) -> HistoryResult:
    """`history --diff A B`: the two runs' records and what changed from A to B; the env is
    compared in the container (names only: values may be secrets)."""
    if len(runs) != 2:
        raise UsageError(f"--diff takes two runs, not {len(runs)}")
    every = history(target, conn)
    first, second = (find_run(every.records, run) for run in runs)
    request: p.HistoryRequest = {
        "op": "history",
        "workdir": target.playbook.spec.workdir,
        "limit": 1,
        "diff": [str(first["run"]), str(second["run"])],
    }
    answer = AgentClient(container_for(target, conn)).history(
        request, timeout=conn.endpoint.command_timeout
    )
    diff = run_diff(first, second, answer.get("env_diff"))
    summary = f"{target.label}: {first['run']} -> {second['run']}: {len(diff['changes'])} change(s)"
    return HistoryResult(ExitCode.OK, sanitize(summary, keep_sgr=False), every.path,
                         [second, first], diff=diff)  # fmt: skip


def find_run(records: list[dict[str, Any]], wanted: str) -> dict[str, Any]:
    """The launched record of a run named by its marker, its id, or the start of its id."""
    launched = [
        r for r in records if isinstance(r.get("run"), str) and r.get("outcome") == "launched"
    ]
    found = [
        r for r in launched
        if r["run"] == wanted or r["run"].partition(":")[2].startswith(wanted)
    ]  # fmt: skip
    if not found:
        raise UsageError(f"--diff: no launched run {wanted!r} in the history")
    if len({r["run"] for r in found}) > 1:
        names = ", ".join(sorted({str(r["run"]) for r in found})[:5])
        raise UsageError(f"--diff: {wanted!r} names several runs ({names}): give more of it")
    return found[0]


def run_diff(
    first: dict[str, Any], second: dict[str, Any], env: dict[str, Any] | None
) -> dict[str, Any]:
    """What changed from run `first` to run `second`: one entry per aspect that differs."""
    changes: list[dict[str, Any]] = []

    def compare(aspect: str, old: Any, new: Any) -> None:
        if old != new:
            changes.append({"aspect": aspect, "from": old, "to": new})

    compare("code", code_of(first), code_of(second))
    compare("source", describe_source(first.get("source")), describe_source(second.get("source")))
    compare("command", first.get("command"), second.get("command"))
    compare("overrides", describe_overrides(first), describe_overrides(second))
    env = env or {}
    for kind in ("added", "removed", "changed"):
        if env.get(kind):
            changes.append({"aspect": f"env {kind}", "names": list(env[kind])})
    return {
        "from": first["run"],
        "to": second["run"],
        "changes": changes,
        "env_known": bool(env.get("known")),
    }


def code_of(record: dict[str, Any]) -> str:
    release = record.get("release")
    if isinstance(release, dict) and release.get("id"):
        return f"release {release['id']}"
    return f"sha256 {str(record.get('sha256') or '?')[:12]}"


def diff_lines(diff: dict[str, Any]) -> list[str]:
    """`history --diff A B` for people (sanitised: it was read from the container)."""
    lines = [f"{diff.get('from')} -> {diff.get('to')}"]
    for change in diff.get("changes") or []:
        aspect = str(change.get("aspect"))
        if "names" in change:
            lines.append(f"  {aspect:<13}{', '.join(str(n) for n in change['names'])}")
        else:
            lines.append(
                f"  {aspect:<13}{change.get('from') or '-'}  ->  {change.get('to') or '-'}"
            )
    if not diff.get("changes"):
        lines.append("  no difference in code, command, environment or overrides")
    if not diff.get("env_known"):
        lines.append("  (env: a run's spec was not kept, so its values could not be compared)")
    return [sanitize(line, keep_sgr=False) for line in lines]


def history_lines(record: dict[str, Any]) -> list[str]:
    """A deploy record for people: one head line and the details under it.

    The record was read from the container, so every line is sanitised for a terminal.
    """
    marks = " [rollback]" if record.get("rollback") else ""
    if record.get("restarted_by"):
        marks += f" [restarted by {record['restarted_by']}]"
    head = (
        f"{record.get('time', '?')}  {record.get('outcome', '?')}  "
        f"sha256 {str(record.get('sha256') or '?')[:12]}  by {record.get('operator', '?')}{marks}"
    )
    lines = [head, f"  command      {record.get('command', '?')}"]
    release = record.get("release")
    if isinstance(release, dict):
        lines.append(
            f"  release      {release.get('id')} (manifest "
            f"{str(release.get('manifest_sha256') or '?')[:12]}, was {release.get('previous')})"
        )
    source = describe_source(record.get("source"))
    if source:
        lines.append(f"  source       {source}")
    told = describe_overrides(record)
    if told:
        lines.append(f"  overrides    {told}")
    if record.get("user") and record.get("client_host"):
        lines.append(f"  by           {record['user']} from {record['client_host']}")
    if record.get("message"):
        lines.append(f"  message      {record.get('message')}")
    if record.get("rollback_reason"):
        lines.append(f"  why          {record.get('rollback_reason')}")
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
        for pruned in ckpt.get("pruned") or []:
            lines.append(f"  pruned       {pruned}")
    elif action == "restore":
        kept = ckpt.get("archived") or "none to set aside"
        lines.append(
            f"  checkpoints  {ckpt.get('from')} moved back in place (replaced run's: {kept})"
        )
    elif action == "purge":
        lines.append(f"  checkpoints  deleted {ckpt.get('from')}")
    elif action == "none":
        lines.append("  checkpoints  none to set aside")
    else:
        lines.append("  checkpoints  kept in place")
    now = checkpoints_now_text(record.get("checkpoints_now"))
    if now:
        lines.append(f"  its ckpts    {now}")
    return [sanitize(line, keep_sgr=False) for line in lines]


def checkpoints_now_text(now: Any) -> str:
    """Where a run's checkpoints are now (the agent follows every record to say it)."""
    if not isinstance(now, dict):
        return ""
    state, path, by = now.get("state"), now.get("path"), now.get("by")
    texts = {
        "live": f"in place at {path}",
        "archived": f"archived at {path}",
        "continued": f"left in place at {path} for run {by}",
        "restored": f"moved back to {path} for run {by}",
        "deleted": "deleted",
        "pruned": f"pruned ({path})",
        "gone": f"gone ({path} is not there any more)",
        "none": "none",
    }
    return texts.get(str(state), str(state))


# --------------------------------------------------------------------------- rollback


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
        return {
            "exit_code": int(self.exit_code),
            "summary": self.summary,
            "sha256": self.sha256,
            "rolled_back_from": self.rolled_back_from,
            "steps": [step.__dict__ for step in self.steps],
            "result": self.result,
        }


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


# --------------------------------------------------------------------------- disconnect


def disconnect() -> int:
    """End this user's persisted connections now (each ends after its idle time anyway); how
    many were asked to."""
    from launcher.transport import persist

    return len(persist.stop_all())
