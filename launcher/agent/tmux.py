# mypy: allow-untyped-calls
"""tmux: its version, its commands, a session's state from one `list-panes`."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time

from launcher.agent.base import AgentError, Started, as_int, run, which

PANE_PREFIX = "LAUNCHER-PANE"
PANE_FORMAT = "\t".join(
    [
        PANE_PREFIX,
        "#{pane_dead}",
        "#{pane_dead_status}",
        "#{pane_pid}",
        "#{pane_width}",
        "#{@launcher_run}",
        "#{session_created}",
    ]
)


# --------------------------------------------------------------------------- tmux


TMUX_VERSIONS: dict[str, str | None] = {}  # tmux binary -> its `-V`, asked once per call


def start_tmux_version():
    """`tmux -V` started now, for tmux_version to read when its check comes (None: no tmux)."""
    binary = which("tmux")
    return Started([binary, "-V"], timeout=10) if binary else None


def tmux_version(started=None):
    """'tmux 3.3a' or None when tmux is not installed (from its `started` run, if given)."""
    binary = which("tmux")
    if not binary:
        return None
    if binary not in TMUX_VERSIONS:
        _, out, err = started.result() if started else run([binary, "-V"], timeout=10)
        TMUX_VERSIONS[binary] = out.strip() or err.strip() or None
    return TMUX_VERSIONS[binary]


def tmux_version_tuple(text):
    match = re.search(r"(\d+)\.(\d+)", text or "")
    return (int(match.group(1)), int(match.group(2))) if match else (99, 0)


# --------------------------------------------------------------------------- a removed socket

# A container that boots systemd ages /tmp (systemd-tmpfiles; Debian 13: files older than 10
# days), and a tmux server nobody attaches to does not refresh its socket (tmux/tmux#4640): the
# server and its run live on, unreachable, and a new client would start a second server. The
# server still holds its listening socket, bound to the path (/proc/net/unix keeps the name),
# and SIGUSR1 makes it bind the path again (tmux server.c: server_signal -> server_create_socket,
# which unlinks and binds but makes no directory: tmux.c's make_label does that, mode 0700).
SOCKET_WAIT = 2.0
NOTES: list[str] = []  # what this call did on its own, for its answer's warnings


def socket_path():
    """The default socket every tmux() call uses (see tmux)."""
    base = os.environ.get("TMUX_TMPDIR") or "/tmp"
    return os.path.join(base, "tmux-%d" % os.getuid(), "default")


def listening_inodes(path):
    """Inodes of the listening Unix sockets bound to `path` in this network namespace."""
    found = set()
    try:
        with open("/proc/net/unix") as f:
            next(f, None)  # Num RefCount Protocol Flags Type St Inode Path
            for line in f:
                fields = line.split(None, 7)
                if len(fields) == 8 and fields[7].strip() == path and int(fields[3], 16) & 0x10000:
                    found.add(fields[6])
    except (OSError, ValueError):
        pass
    return found


def socket_holders(inodes):
    """tmux processes (by comm) that hold one of the socket `inodes`."""
    holders = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/comm" % name) as f:
                if not f.read().startswith("tmux"):
                    continue
            fds = os.listdir("/proc/%s/fd" % name)
        except OSError:
            continue
        for fd in fds:
            with contextlib.suppress(OSError):
                link = os.readlink("/proc/%s/fd/%s" % (name, fd))
                if link.startswith("socket:[") and link[8:-1] in inodes:
                    holders.append(int(name))
                    break
    return holders


def restore_socket():
    """The pid of a live tmux server whose removed socket was made again, or None (the socket
    is there, or no server is listening on its path)."""
    path = socket_path()
    if os.path.exists(path):
        return None
    inodes = listening_inodes(path)
    if not inodes:
        return None
    for pid in socket_holders(inodes):
        with contextlib.suppress(FileExistsError):
            os.mkdir(os.path.dirname(path), 0o700)
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGUSR1)
        deadline = time.monotonic() + SOCKET_WAIT
        while not os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(0.02)
        if os.path.exists(path):
            NOTES.append(
                "tmux's socket %s had been removed under its live server (pid %d; a /tmp "
                "cleaner such as systemd-tmpfiles?): made again with SIGUSR1" % (path, pid)
            )
            return pid
    return None


def tmux(args, timeout=15.0, env=None):
    """tmux with `args`; env: the client's environment (None: the agent's). A server this
    starts takes the client's environment as its global one. Every call talks to the same
    server: the agent's own TMUX_TMPDIR (or none: /tmp/tmux-UID/default), never one from
    `env` or an enclosing $TMUX."""
    binary = which("tmux")
    if not binary:
        raise AgentError("missing", "tmux is not installed in the container")
    env = dict(os.environ if env is None else env)
    env.pop("TMUX", None)
    env.pop("TMUX_TMPDIR", None)
    if os.environ.get("TMUX_TMPDIR"):
        env["TMUX_TMPDIR"] = os.environ["TMUX_TMPDIR"]
    restore_socket()  # else a live server is "no server running", and a launch starts another
    return run([binary, *args], timeout=timeout, env=env)


def tmux_arg(text):
    # tmux treats any argument ending in ';' as a command separator; '\;' keeps a literal ';'.
    return text[:-1] + "\\;" if text.endswith(";") else text


def format_escape(text):
    # Arguments tmux format-expands (-c, pipe-pane's command) need '#' doubled.
    return text.replace("#", "##")


def no_session(state=None):
    base = {
        "exists": False,
        "pane_dead": None,
        "dead_status": None,
        "pane_pid": None,
        "width": None,
        "run": None,
        "created": None,
    }
    if state:
        base.update(state)
    return base


def parse_pane_line(line):
    fields = line.split("\t")
    fields += [""] * (7 - len(fields))
    return no_session(
        {
            "exists": True,
            "pane_dead": fields[1] == "1",
            "dead_status": as_int(fields[2]),
            "pane_pid": as_int(fields[3]),
            "width": as_int(fields[4]),
            "run": fields[5] or None,
            "created": as_int(fields[6]),
        }
    )


def session_state(session):
    """SESSION dict from one `list-panes`; an absent session or server means exists: false."""
    if not which("tmux"):
        return no_session()
    _, out, _ = tmux(["list-panes", "-t", "=%s:" % session, "-F", PANE_FORMAT])
    for line in out.splitlines():
        if line.startswith(PANE_PREFIX + "\t"):
            return parse_pane_line(line)
    return no_session()


def pane_active(state):
    return bool(state["exists"] and not state["pane_dead"])
