# mypy: allow-untyped-calls
"""The `poll` op: the session, its pane, the run's records and its GPUs in one answer."""

from __future__ import annotations

import os
import time

from launcher.agent.base import which
from launcher.agent.gpus import poll_gpus, poll_query
from launcher.agent.lock import lock_state
from launcher.agent.params import param, session_param, workdir_param
from launcher.agent.paths import (
    exit_path,
    file_age,
    log_path,
    read_exit_code,
    read_json,
    state_dir,
    stopped_path,
)
from launcher.agent.processes import run_pids
from launcher.agent.protocol import LOCK_PATH
from launcher.agent.tmux import PANE_FORMAT, PANE_PREFIX, no_session, parse_pane_line, tmux


def op_poll(request, warnings):
    workdir = workdir_param(request)
    session = session_param(request)
    lines = param(request, "lines", int, default=200)
    gpus = param(request, "gpus", int, default=0)
    # nvidia-smi can take a second on 8 GPUs, 30 without the persistence daemon, or hang: it
    # runs detached while the pane is captured, and the poll waits POLL_GPU_TIMEOUT at most.
    query = poll_query() if gpus > 0 else None
    state, capture = no_session(), ""
    if which("tmux"):
        target = "=%s:" % session
        _, out, _ = tmux(
            ["list-panes", "-t", target, "-F", PANE_FORMAT, ";",
             "capture-pane", "-p", "-J", "-S", "-%d" % max(lines, 0), "-t", target]
        )  # fmt: skip
        head, _, capture = out.partition("\n")
        if head.startswith(PANE_PREFIX + "\t"):
            state = parse_pane_line(head)
        else:
            capture = ""
    else:
        warnings.append("tmux is not installed in the container")
    exit_code = read_exit_code(exit_path(workdir, session))
    if state["pane_dead"] and state["dead_status"] is None:
        # tmux can miss the pane's SIGCHLD (libutempter resets the handler while it waits for
        # its helper), leaving the pane dead with no status; the runner wrote the same code.
        state["dead_status"] = exit_code
    return {
        "session": state,
        "capture": capture.rstrip("\n"),
        "exit_code": exit_code,
        "stopped": read_json(stopped_path(workdir, session)),
        "now": time.time(),
        "record": read_json(os.path.join(state_dir(workdir), "current.json")),
        "log_age": file_age(log_path(workdir, session)),
        "checkpoint_age": tree_age(param(request, "checkpoints", str)),
        # A deploy in progress: verify then waits for the new run instead of calling it dead.
        "lock": lock_state(param(request, "lock_path", str, default=LOCK_PATH)),
        "gpus": poll_gpus(gpus, run_pids(state["pane_pid"], session), query, POLL_GPU_TIMEOUT)
        if query is not None
        else None,
    }


POLL_GPU_TIMEOUT = 3.0  # s a poll waits for nvidia-smi at most


CHECKPOINT_SCAN = 2000  # entries looked at, at most, for one poll's checkpoint_age


def tree_age(path, limit=CHECKPOINT_SCAN):
    """Seconds since anything at `path` or up to two levels below it was written (a file
    grows as a save writes it; a directory changes as entries come and go); None when there
    is no such directory. A tree of more than `limit` entries counts as being written (0):
    an age it did not finish looking for must not make a saving run look silent."""
    if not path:
        return None
    try:
        newest = os.stat(path).st_mtime
    except OSError:
        return None
    seen, pending = 0, [(path, 0)]
    while pending:
        directory, depth = pending.pop()
        try:
            entries = os.scandir(directory)
        except OSError:
            continue
        with entries:
            for entry in entries:
                seen += 1
                if seen > limit:
                    return 0.0
                try:
                    info = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                newest = max(newest, info.st_mtime)
                if depth < 1 and entry.is_dir(follow_symlinks=False):
                    pending.append((entry.path, depth + 1))
    return max(0.0, time.time() - newest)
