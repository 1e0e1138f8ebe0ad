# mypy: allow-untyped-calls
"""The `logs`, `follow` and `history` ops: the run's log file (or pane) and deploy records."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import time

from launcher.agent.base import AgentError
from launcher.agent.params import param, session_param, workdir_param
from launcher.agent.paths import exit_path, log_path, read_exit_code, state_dir
from launcher.agent.runs import env_diff, read_records, where_checkpoints_are
from launcher.agent.tmux import session_state, tmux


def clean_line(line):
    """A log line as a terminal would show it: no CR line ending, only the last CR overwrite."""
    line = line.rstrip("\r")
    return line.rpartition("\r")[2] if "\r" in line else line


LINE_LIMIT = 16384  # bytes of one log line answered; the rest is cut, and said so


def cut_line(line):
    if len(line) <= LINE_LIMIT:
        return line
    return line[:LINE_LIMIT] + b" [line cut: %d more bytes]" % (len(line) - LINE_LIMIT)


def tail_file(path, count, block=65536):
    """(complete lines, partial last line, offset after the last newline) of the file's end.

    Reads backwards from the end, a block at a time and at most what `count` lines of
    LINE_LIMIT bytes take, so a multi-gigabyte log, or one endless line, costs only that;
    a longer line is cut and marked.
    """
    budget = (max(count, 0) + 1) * LINE_LIMIT + block
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        position, blocks, newlines = size, [], 0
        while position > 0 and newlines <= count and size - position < budget:
            step = min(block, position)
            position -= step
            f.seek(position)
            blocks.append(f.read(step))
            newlines += blocks[-1].count(b"\n")
    data = b"".join(reversed(blocks))
    complete, _, partial = data.rpartition(b"\n")
    offset = size - len(partial)
    lines = complete.split(b"\n") if b"\n" in data else []
    first = None
    if position > 0 and lines:  # the first one began before what was read: its end, marked
        first = b"[line cut: its start not read] " + lines[0][-LINE_LIMIT:]
    lines = [cut_line(line) for line in lines]
    if first is not None:
        lines[0] = first
    lines = [decoded(line) for line in lines[-count:]] if count > 0 else []
    if len(partial) > LINE_LIMIT:  # its end is the newest: keep that
        partial = (
            b"[line cut: %d bytes before] " % (len(partial) - LINE_LIMIT) + partial[-LINE_LIMIT:]
        )
    return lines, decoded(partial), offset


def decoded(line):
    return clean_line(line.decode("utf-8", "replace"))


def op_logs(request, warnings):
    """The last N lines of the run's log file (or, raw, of its pane) plus what follow needs."""
    workdir = workdir_param(request)
    session = session_param(request)
    count = max(param(request, "lines", int, default=50), 0)
    raw = param(request, "raw", bool, default=False)
    path = log_path(workdir, session)
    state = session_state(session)
    result = {
        "source": "pane" if raw else "log",
        "log_file": path,
        "log_exists": os.path.isfile(path),
        "lines": [],
        "partial": "",
        "offset": 0,
        "session": state,
        "exit_code": read_exit_code(exit_path(workdir, session)),
    }
    if raw:
        if state["exists"]:
            _, out, _ = tmux(
                ["capture-pane", "-p", "-J", "-S", "-%d" % count, "-t", "=%s:" % session]
            )
            lines = out.rstrip("\n").split("\n") if out.strip() else []
            result["lines"] = [line.rstrip() for line in lines[-count:]] if count else []
    elif result["log_exists"]:
        lines, partial, offset = tail_file(path, count)
        result.update({"lines": lines, "partial": partial, "offset": offset})
    return result


def run_end(workdir, session):
    """How the run ended ({"reason", "exit_code"}), or None while it is still running."""
    code = read_exit_code(exit_path(workdir, session))
    if code is not None:
        return {"reason": "exited", "exit_code": code}
    state = session_state(session)
    if not state["exists"]:
        return {"reason": "session gone", "exit_code": None}
    if state["pane_dead"]:
        return {"reason": "exited", "exit_code": state["dead_status"]}
    return None


def stdin_closed(timeout):
    """Wait up to `timeout` s; True when stdin reached EOF (the client closed the channel)."""
    try:
        ready, _, _ = select.select([0], [], [], timeout)
        return bool(ready) and os.read(0, 4096) == b""
    except (OSError, ValueError):
        time.sleep(timeout)
        return False


def follow_log(workdir, session, offset, write, beat, client_gone, options=None):
    """Write the log from `offset` on as it grows, until the run ends or the client goes away.

    write(bytes) sends log data; beat() proves the client is still there (a write to a closed
    channel fails); client_gone(seconds) waits and says whether the client closed its end.
    Returns {"ended": run_end() or None, "client_gone": bool, "offset": int}.
    """
    options = options or {}
    interval = options.get("interval", 0.2)
    heartbeat = options.get("heartbeat", 5.0)
    settle = options.get("settle", 0.5)
    check_every = options.get("check_every", 1.0)
    path = log_path(workdir, session)
    position, handle, ended, drain_until = offset, None, None, None
    last_beat = last_check = 0.0
    result = {"ended": None, "client_gone": False, "offset": offset}
    try:
        while True:
            if handle is None:
                with contextlib.suppress(OSError):
                    handle = open(path, "rb")
            data = b""
            if handle is not None:
                if os.fstat(handle.fileno()).st_size < position:
                    position = 0  # truncated or replaced: start again from its beginning
                handle.seek(position)
                data = handle.read(65536)
            if data:
                position += len(data)
                result["offset"] = position
                write(data)
                if drain_until is not None:
                    drain_until = max(drain_until, time.monotonic() + interval)
                continue
            now = time.monotonic()
            if ended is None and now - last_check >= check_every:
                last_check = now
                ended = run_end(workdir, session)
                if ended is not None:
                    # pipe-pane's cat may still be writing the last lines: drain a little.
                    drain_until = now + settle
            if drain_until is not None and now >= drain_until:
                result["ended"] = ended
                return result
            if now - last_beat >= heartbeat:
                last_beat = now
                beat()
            if client_gone(interval):
                result["client_gone"] = True
                return result
    except (BrokenPipeError, ConnectionError):
        result["client_gone"] = True
        return result
    finally:
        if handle is not None:
            handle.close()


def op_follow(request, warnings):
    """Stream the run's log to stdout from `offset` until the run ends (envelope on stderr)."""
    workdir = workdir_param(request)
    session = session_param(request)
    offset = max(param(request, "offset", int, default=0), 0)
    options = {
        "heartbeat": param(request, "heartbeat", float, default=5.0),
        "interval": param(request, "interval", float, default=0.2),
    }
    out = sys.stdout.buffer

    def write(data):
        out.write(data)
        out.flush()

    def beat():
        sys.stderr.write("\n")
        sys.stderr.flush()

    # A closed channel must end this op, not kill it mid-write with SIGPIPE.
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    return follow_log(workdir, session, offset, write, beat, stdin_closed, options)


# --------------------------------------------------------------------------- ops: history, rollback


def op_history(request, warnings):
    """Deploy records from <workdir>/.launcher/deploys.jsonl, newest first; each launched run's
    with `checkpoints_now`: where its checkpoints are now (runs.where_checkpoints_are)."""
    workdir = workdir_param(request)
    limit = max(param(request, "limit", int, default=0), 0)
    path = os.path.join(state_dir(workdir), "deploys.jsonl")
    records, unreadable = read_records(workdir)
    if unreadable:
        warnings.append("%d unreadable line(s) in %s skipped" % (unreadable, path))
    where = where_checkpoints_are(records)
    for record in records:
        if record.get("run") in where and record.get("outcome") == "launched":
            record["checkpoints_now"] = where[record["run"]]
    records.reverse()
    answer = {"path": path, "records": records[:limit] if limit else records, "total": len(records)}
    pair = param(request, "diff", list)
    if pair is not None:
        if len(pair) != 2 or not all(isinstance(run, str) for run in pair):
            raise AgentError("invalid", "diff takes two runs")
        answer["env_diff"] = env_diff(workdir, pair[0], pair[1])
    return answer
