# mypy: allow-untyped-calls
"""The container's processes from /proc: a run's process tree, signals, waiting for exits."""

from __future__ import annotations

import contextlib
import os
import select
import time

from launcher.agent.base import MARKER_VAR

# --------------------------------------------------------------------------- processes


def proc_stat(pid):
    """(state, ppid, pgrp, sid) from /proc/PID/stat, or None when the process is gone."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            data = f.read()
    except OSError:
        return None
    # comm may contain spaces and parentheses: the fields start after the last ')'.
    fields = data[data.rindex(b")") + 2 :].split()
    return fields[0].decode(), int(fields[1]), int(fields[2]), int(fields[3])


def proc_table():
    table = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            stat = proc_stat(int(name))
            if stat and stat[0] != "Z":
                table[int(name)] = stat
    return table


def has_marker(pid, prefix):
    try:
        with open("/proc/%d/environ" % pid, "rb") as f:
            environ = f.read()
    except OSError:
        return False
    return any(item.startswith(prefix) for item in environ.split(b"\0"))


def protected_pids(table):
    """This process and its ancestors: never part of a run, whatever the scan says."""
    pids = {1, os.getpid()}
    pid = os.getpid()
    while pid in table and table[pid][1] not in pids and table[pid][1] > 0:
        pid = table[pid][1]
        pids.add(pid)
    return pids


def descendants(table, roots):
    children: dict[int, list[int]] = {}
    for pid, stat in table.items():
        children.setdefault(stat[1], []).append(pid)
    found, todo = set(), [r for r in roots if r in table]
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, []))
    return found


def marker_prefix(session):
    return ("%s=%s:" % (MARKER_VAR, session)).encode()


def run_pids(pane_pid, session):
    """The run's live processes: the pane's tree, its session/process group, and every process
    carrying the run marker (children that left the tree or called setsid still count)."""
    table = proc_table()
    roots = {pane_pid} if pane_pid else set()
    found = descendants(table, roots)
    found.update(pid for pid, st in table.items() if st[2] in roots or st[3] in roots)
    prefix = marker_prefix(session)
    found.update(pid for pid in table if pid not in found and has_marker(pid, prefix))
    return found - protected_pids(table)


SHELLS = ("sh", "bash", "dash", "zsh", "fish", "ksh", "mksh", "tcsh", "csh")


def is_shell(pid):
    try:
        with open("/proc/%d/comm" % pid) as f:
            return f.read().strip().lstrip("-") in SHELLS
    except (OSError, TypeError):
        return False


def alive(pids):
    live = set()
    for pid in pids:
        stat = proc_stat(pid)
        if stat and stat[0] != "Z":
            live.add(pid)
    return live


def signal_pids(pids, signum):
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)


def wait_for(predicate, timeout, interval=0.05, on_tick=None, pids=None):
    """True once predicate() is, False when `timeout` s passed first; asked every `interval` s,
    and at once when one of `pids()` (the processes whose exit it waits for) exits."""
    deadline = time.monotonic() + max(timeout, 0.0)
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        if on_tick is not None:
            on_tick(deadline - time.monotonic())
        if pids is None:
            time.sleep(interval)
        else:
            wait_exit(pids(), interval)


# A wait for processes that have all exited already lasts this long: what the predicate still
# waits for (tmux marking the pane dead) follows their exit within milliseconds.
SETTLE = 0.005


def wait_exit(pids, timeout):
    """Return when one of `pids` exits, or after `timeout` s; with no pids, after SETTLE s.

    Polls pidfds (Linux 5.3+, Python 3.9+): a process that exits wakes the wait at once,
    where a plain sleep would add up to `timeout` to every stop. Elsewhere: a plain sleep."""
    if not pids:
        time.sleep(min(timeout, SETTLE))
        return
    fds = []
    try:
        poller = select.poll()
        for pid in pids:
            fds.append(os.pidfd_open(pid))  # novermin: 3.9+, the except below falls back
            poller.register(fds[-1], select.POLLIN)
    except ProcessLookupError:
        return  # gone already
    except (AttributeError, OSError):  # no pidfds here (old kernel or Python, seccomp)
        time.sleep(timeout)
        return
    else:
        poller.poll(max(timeout, 0.0) * 1000)
    finally:
        for fd in fds:
            os.close(fd)


def grace_countdown(grace, progress, every=1.0):
    """An on_tick for wait_for that tells `progress` the grace left, at most once per `every`."""
    if progress is None:
        return None
    last = [time.monotonic()]

    def tick(left):
        now = time.monotonic()
        if now - last[0] >= every:
            last[0] = now
            progress(
                "C-c sent; waiting for the run to exit: %d s of %g s left" % (left + 0.5, grace)
            )

    return tick


def process_command(pid, limit=120):
    """The command line of `pid` for messages (cut to `limit`), or None when it is gone."""
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            text = f.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
    except OSError:
        return None
    return text if len(text) <= limit else text[: limit - 3] + "..."
