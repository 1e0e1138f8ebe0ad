"""`launcher logs`: the run's log (or its pane) on a target, and with `--follow` the new lines
as they are written until the run ends or Ctrl-C (which never stops the run).

A result, not an error, when there is nothing to show; every container op is one `pct exec` of
the agent, and following streams over one more.
"""

from __future__ import annotations

import codecs
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from launcher.agent import protocol as p
from launcher.config.models import Target
from launcher.container.agentclient import AgentClient, container_for
from launcher.container.pct import HostConnection
from launcher.core.errors import ExitCode, LauncherError
from launcher.core.requests import LogsRequest
from launcher.output.termsafe import Sanitizer, resolve_cr, sanitize
from launcher.targets.workflow import Context

LineSink = Callable[[str], None]
ByteSink = Callable[[bytes], None]

# The agent proves the stream is alive this often; silence for HEARTBEAT_MISSES of them means
# the connection is dead.
HEARTBEAT = 5.0
HEARTBEAT_MISSES = 6
# A followed line longer than this (characters) is shown in pieces rather than held in memory.
MAX_LINE = 1 << 20


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
        return {**asdict(self), "exit_code": int(self.exit_code)}


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


def _ended_text(ended: dict[str, Any] | None) -> str:
    if not ended:
        return "ended"
    if ended.get("exit_code") is not None:
        return f"ended with exit code {ended['exit_code']}"
    return f"ended ({ended.get('reason', 'session gone')})"
