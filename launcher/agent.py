# mypy: allow-untyped-calls
"""The in-container agent: one request in, one JSON answer out, in a single round trip.

launcher runs this file inside the container with

    pct exec VMID -- python3 -c BOOT

where BOOT reads one JSON line from stdin and runs the loader in it (agentclient.LOADER): that
takes protocol.py and this source from the line, or from the container's cache (/run/launcher,
checked against their sha256; see store_bundle at the end), executes both in one namespace and
calls ``main(request)``. It therefore has to run on whatever python3 the container has: Python
3.8 syntax, standard library only, and no imports from launcher except the protocol (which
travels with it).

launcher/protocol.py defines every op's request and answer, the envelope, the error kinds and the
constants shared with the client.

Ops: preflight, apply, stop, poll, logs, follow, history, rollback. `follow` streams: its stdout
carries the log bytes as they are written, a blank line goes to stderr now and then (a write to
a closed channel ends it), and its envelope is the last line on stderr.
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import fcntl
import hashlib
import json
import marshal
import os
import re
import select
import shlex
import shutil
import signal
import subprocess
import sys
import time

# Only mypy reads the annotations (postponed by the __future__ import): the agent's start, on
# every call, need not import typing.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any
if __name__ != "launcher_agent":
    # Imported as part of the package (the client, tests). In the container protocol.py's
    # source has already run in this namespace (see the module docstring).
    from launcher.protocol import (
        ERROR_KINDS,
        HISTORY_LIMIT,
        LOCK_PATH,
        OPS,
        PANE_HEIGHT,
        PANE_WIDTH,
        RUN_REPLACED,
        STATE_DIR,
        STREAMING_OPS,
        system_path_problem,
    )
PYTHON_VERSION = "%d.%d.%d" % sys.version_info[:3]  # what platform.python_version() says
SCRIPT_HISTORY = 5
MARKER_VAR = "LAUNCHER_RUN"
PLACEHOLDER_WINDOW = "launcher-placeholder"
RUN_WINDOW = "run"
# `pct exec` gives a minimal PATH; look in the usual places too.
EXTRA_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Patterns are compiled on first use (re keeps them): each call starts a new interpreter.
SESSION_NAME = r"^[A-Za-z0-9_][A-Za-z0-9_-]{0,63}$"
ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"
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
# Runs the playbook command and records how it ended. The command and the environment come from
# the run file ($1, mode 0600, written by the deploy), so no secret is ever in a command line or a
# tmux format; the exit file ($2) and the shell ($3) arrive as positional parameters, never glued
# into this text. The trap keeps the runner alive through C-c / SIGHUP so it can still write the
# exit code; caught signals are reset to default in the command, unlike ignored ones.
RUNNER = (
    "trap : INT TERM HUP\n"
    'if [ -r "$1" ]; then . "$1"; "$3" -c "$LAUNCHER_COMMAND"; code=$?\n'
    'else echo "launcher: cannot read the run file $1" >&2; code=126; fi\n'
    'printf "%s\\n" "$code" > "$2.tmp" && mv -f "$2.tmp" "$2"\nexit "$code"\n'
)
COMMAND_VAR = "LAUNCHER_COMMAND"
# One argument to exec may be at most 128 KiB (MAX_ARG_STRLEN) and the whole environment shares
# ARG_MAX with it: refuse what could not start, before anything is stopped.
COMMAND_LIMIT = 100000
ENV_LIMIT = 1 << 20
# Linux: one argv or environment string, its NUL included (fs/exec.c: valid_arg_len,
# MAX_ARG_STRLEN = 32 pages); exec fails with E2BIG ("Argument list too long") above it.
ARG_STRLEN = 32 * 4096
# Sources the staged run file and execs the shell with its environment: proves exec takes it
# (E2BIG shows here, before the stop, not as a run that dies at once after it).
DRY_LAUNCH = '. "$1" && exec "$2" -c :'
# Stop grace is bounded: a trainer that ignores C-c must not hold the deploy lock forever.
GRACE_LIMIT = 3600.0

# Compiles argv[1] as if it were argv[2] with another interpreter; a syntax error is answered as
# JSON [line, column, message] (exit 3) so the message can quote the *new* script's line.
COMPILE = (
    "import json,sys\n"
    "src=sys.stdin.buffer.read() if sys.argv[1]=='-' else open(sys.argv[1],'rb').read()\n"
    "try: compile(src,sys.argv[2],'exec',dont_inherit=True)\n"
    "except SyntaxError as e: print(json.dumps([e.lineno,e.offset,e.msg])); sys.exit(3)\n"
)


class AgentError(Exception):
    """An expected failure: becomes the envelope's error, never a traceback."""

    def __init__(self, kind, message, **extra):
        super().__init__(message)
        self.kind = kind if kind in ERROR_KINDS else "failed"
        self.message = message
        self.extra = extra

    def as_dict(self):
        error = {"kind": self.kind, "message": self.message}
        error.update(self.extra)
        return error


# --------------------------------------------------------------------------- small helpers


def utc_now():
    return datetime.datetime.now(datetime.timezone.utc)


def utc_iso():
    return utc_now().strftime("%Y-%m-%dT%H:%M:%SZ")


def random_hex(digits):
    """`digits` random hex digits, for unique temp names and run ids (the uuid module would
    import platform: ~7 ms of every call's start)."""
    return os.urandom((digits + 1) // 2).hex()[:digits]


def sha256_file(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def sha256_or_none(path):
    try:
        return sha256_file(path)
    except OSError:
        return None


def which(name):
    return shutil.which(name, path=os.environ.get("PATH", "") + ":" + EXTRA_PATH)


def ignore_hangup(signum, frame):
    """SIGHUP's handler while the agent must outlive its client. A handler, not SIG_IGN: an
    ignored signal stays ignored across exec, a caught one is reset to the default, so the
    children (a tmux server started from here, the trainer under it) get the default without a
    preexec_fn, which would make every spawn a full fork (~4 ms each instead of ~1 ms).
    SIGPIPE, which Python ignores, subprocess restores in the child itself."""


def run(argv, timeout=30.0, input=None):
    """Run argv (no shell); return (returncode, stdout, stderr). A missing binary is rc 127."""
    try:
        proc = subprocess.run(
            argv,
            input=input,
            stdin=subprocess.DEVNULL if input is None else None,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            timeout=timeout,
        )
    except FileNotFoundError as exc:
        return 127, "", str(exc)
    except subprocess.TimeoutExpired:
        return 124, "", "%s timed out after %ss" % (argv[0], timeout)
    out = proc.stdout.decode("utf-8", "replace")
    err = proc.stderr.decode("utf-8", "replace")
    return proc.returncode, out, err


class Started:
    """A command started now and answered later, like run(): its wait overlaps other work.
    Its output must be small (a pipe's worth) or it waits, harmlessly, until read."""

    def __init__(self, argv, timeout=30.0):
        self.argv, self.timeout = argv, timeout
        self.deadline = time.monotonic() + timeout
        self.proc, self.missing = None, ""
        try:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
        except OSError as exc:
            self.missing = str(exc)

    def result(self):
        """(returncode, stdout, stderr) as run() gives them."""
        if self.proc is None:
            return 127, "", self.missing
        try:
            out, err = self.proc.communicate(timeout=max(0.0, self.deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.cancel()
            return 124, "", "%s timed out after %ss" % (self.argv[0], self.timeout)
        return self.proc.returncode, out.decode("utf-8", "replace"), err.decode("utf-8", "replace")

    def cancel(self):
        """Kill it if it still runs; never waits on its pipes (a child of its could hold them)."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()


def write_atomic(path, text):
    tmp = path + ".tmp-%d" % os.getpid()
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def remove_quietly(path):
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def list_dir(path):
    try:
        return os.listdir(path)
    except OSError:
        return []


# --------------------------------------------------------------------------- request parsing


def param(request, key, kind, default=None, required=False):
    """Fetch request[key] checked against kind; bad or missing values are `invalid` errors."""
    if key not in request or request[key] is None:
        if required:
            raise AgentError("invalid", "missing parameter %r" % key)
        return default
    value = request[key]
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if kind is int and isinstance(value, bool):
        raise AgentError("invalid", "parameter %r must be an integer" % key)
    if not isinstance(value, kind):
        raise AgentError("invalid", "parameter %r must be %s" % (key, kind.__name__))
    return value


def session_param(request):
    session = param(request, "session", str, required=True)
    # tmux rewrites '.' and ':' in names and targets would misparse; the name is also a file name.
    if not re.match(SESSION_NAME, session):
        raise AgentError("invalid", "session name %r must match %s" % (session, SESSION_NAME))
    return session


def workdir_param(request):
    """The workdir, refused when it (or what its symlinks resolve to) is / or a system directory.

    Checked by the real path inside the container at the moment of use: a workdir that is a
    symlink to / would otherwise make every workdir-relative path a path below /."""
    workdir = param(request, "workdir", str, required=True)
    if not os.path.isabs(workdir):
        raise AgentError("unsafe_path", "workdir must be an absolute path: %r" % workdir)
    # POSIX keeps a leading '//' in normpath; it means / here.
    workdir = "/" + os.path.normpath(workdir).lstrip("/")
    real = os.path.realpath(workdir)
    problem = system_path_problem(workdir)
    if problem is None and system_path_problem(real):
        problem = "it resolves to %s (%s)" % (real, system_path_problem(real))
    if problem:
        raise AgentError("unsafe_path", "workdir %s is refused: %s" % (workdir, problem))
    return workdir


def env_param(request):
    env = param(request, "env", dict, default={})
    for key, value in env.items():
        if not re.match(ENV_NAME, key) or key in (MARKER_VAR, COMMAND_VAR):
            raise AgentError("invalid", "bad environment variable name %r" % key)
        if not isinstance(value, str) or "\0" in value:
            raise AgentError(
                "invalid", "environment value of %s must be a string without NUL" % key
            )
    return env


# --------------------------------------------------------------------------- paths


def state_dir(workdir):
    return os.path.join(workdir, STATE_DIR)


def log_path(workdir, session):
    return os.path.join(state_dir(workdir), session + ".log")


def stopped_path(workdir, session):
    """Written by `stop` (who, when): the run's end was asked for, not its own. A launch
    removes it with the exit file."""
    return os.path.join(state_dir(workdir), session + ".stopped")


def exit_path(workdir, session):
    return os.path.join(state_dir(workdir), session + ".exit")


def run_file_path(workdir, session):
    return os.path.join(state_dir(workdir), session + ".run")


def grace_param(request):
    grace = param(request, "grace", float, default=30.0)
    if not (0.0 <= grace <= GRACE_LIMIT):  # also false for nan
        raise AgentError("invalid", "grace must be 0 to %g seconds (got %r)" % (GRACE_LIMIT, grace))
    return grace


def run_file_text(marker, command, env):
    """The run file the runner sources: every value quoted by shlex, one assignment a line."""
    lines = ["# launcher run %s: read by the run's wrapper; mode 0600" % marker]
    lines.append("export %s=%s" % (MARKER_VAR, shlex.quote(marker)))
    lines += ["export %s=%s" % (k, shlex.quote(v)) for k, v in sorted(env.items())]
    lines.append("%s=%s" % (COMMAND_VAR, shlex.quote(command)))
    return "\n".join(lines) + "\n"


def write_private(path, text):
    """Write `path` readable by its owner only, whatever the umask, replacing it atomically."""
    tmp = "%s.tmp-%d" % (path, os.getpid())
    remove_quietly(tmp)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def is_strict_child(path, parent):
    return path != parent and path.startswith(parent.rstrip("/") + "/")


def relative_problem(rel):
    """Why a workdir-relative path from the request is unacceptable, or None."""
    if rel == "" or rel == ".":
        return "it is the workdir itself"
    if ".." in rel.split("/"):
        return "it contains '..'"
    return None


def checkpoint_problem(workdir, rel, protected=()):
    """(absolute path, reason it is unsafe to move or delete, or None).

    Judged by real paths at the moment of use: the checkpoints must resolve strictly inside the
    real workdir, not be a symlink, and neither be, contain nor sit inside anything the run or
    launcher itself needs (`protected`: the script, its backups, .launcher/ with the log and the
    exit file)."""
    path = os.path.normpath(os.path.join(workdir, rel))
    reason = relative_problem(rel)
    real_workdir = os.path.realpath(workdir)
    real = os.path.realpath(path)
    if reason is None and os.path.islink(path):
        reason = "it is a symlink (to %s)" % os.readlink(path)
    if reason is None and real == "/":
        reason = "it resolves to /"
    if reason is None and real == real_workdir:
        reason = "it is the workdir itself"
    if reason is None and not is_strict_child(real, real_workdir):
        reason = "it resolves to %s, outside the workdir %s" % (real, real_workdir)
    for other in protected if reason is None else ():
        real_other = os.path.realpath(other)
        if real == real_other:
            reason = "it is %s, which launcher needs" % other
        elif is_strict_child(real_other, real):
            reason = "it contains %s, which launcher needs" % other
        elif is_strict_child(real, real_other):
            reason = "it is inside %s, which launcher needs" % other
        if reason:
            break
    return path, reason


def protected_paths(workdir, session, dest=None):
    """What checkpoints may never be or contain: launcher's state and the installed script."""
    paths = [state_dir(workdir), log_path(workdir, session), exit_path(workdir, session)]
    if dest:
        paths += [dest, dest + ".prev"]
    return paths


def dest_path(workdir, rel):
    path = os.path.normpath(os.path.join(workdir, rel))
    reason = relative_problem(rel) or (None if not os.path.isabs(rel) else "it is absolute")
    real_parent = os.path.realpath(os.path.dirname(path))
    real_workdir = os.path.realpath(workdir)
    if reason is None and not (
        real_parent == real_workdir or is_strict_child(real_parent, real_workdir)
    ):
        reason = "its directory resolves outside the workdir"
    if reason:
        raise AgentError("unsafe_path", "script destination %r is unsafe: %s" % (rel, reason))
    return path


def dest_problem(workdir, dest):
    """Why the script may not be installed at `dest`, judged by real paths, or None: not over a
    directory (the install would fail half-way), not among launcher's own records (the deploy
    history, the run file and the log would be overwritten)."""
    if os.path.isdir(dest):
        return "it is an existing directory"
    real = os.path.join(os.path.realpath(os.path.dirname(dest)), os.path.basename(dest))
    real_state = os.path.realpath(state_dir(workdir))
    if real == real_state or is_strict_child(real, real_state):
        return "it is inside %s, launcher's own records" % state_dir(workdir)
    return None


def tmp_path(workdir, tmp):
    real_workdir = os.path.realpath(workdir)
    if not os.path.isabs(tmp) or not is_strict_child(os.path.realpath(tmp), real_workdir):
        raise AgentError("unsafe_path", "pushed file %r is not inside the workdir" % tmp)
    if os.path.islink(tmp) or not os.path.isfile(tmp):
        raise AgentError("failed", "pushed file %s is missing or not a regular file" % tmp)
    return tmp


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


def tmux(args, timeout=15.0):
    binary = which("tmux")
    if not binary:
        raise AgentError("missing", "tmux is not installed in the container")
    return run([binary, *args], timeout=timeout)


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


def as_int(text):
    try:
        return int(text)
    except (TypeError, ValueError):
        return None


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


def emit_event(event):
    """One progress event as a JSON line on stderr (the client shows it as it happens); the
    answer itself stays the last line on stdout. A client that went away is no reason to stop."""
    try:
        sys.stderr.write(json.dumps(event) + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


# --------------------------------------------------------------------------- GPUs


GPU_NAMES_ARGS = ["-L"]
# Device facts only. Inside a container nvidia-smi's process list carries HOST PIDs (the driver
# is not PID-namespace aware: NVIDIA/nvidia-docker#179, #1460, #1483), which name nothing or,
# worse, an unrelated process here: launcher never asks nvidia-smi for processes, so no PID it
# signals can have come from there. Who holds a GPU is read from /proc (gpu_device_holders).
GPU_QUERY_ARGS = [
    "--query-gpu=index,uuid,memory.used,memory.total,utilization.gpu",
    "--format=csv,noheader,nounits",
]
# How many contexts each GPU has and their memory, without PIDs: more contexts on a GPU than
# processes here with it open means someone outside uses it too, while the old run holds it.
GPU_CONTEXTS_ARGS = ["--query-compute-apps=gpu_uuid,used_memory", "--format=csv,noheader,nounits"]
GPU_DEVICE = re.compile(r"^/dev/nvidia(\d+)$")
# Memory in use on a GPU (MiB) above which someone uses it: an idle GPU shows 0 to a few MiB,
# and the smallest CUDA context takes a few hundred.
GPU_IDLE_MIB = 256
GPU_RELEASE_WAIT = 10.0  # s the driver may take to free an exited process's memory


def start_gpu_queries(names, devices, contexts=False):
    """The nvidia-smi queries asked for, started at once (each can take a good part of a
    second on a real 8-GPU host) for gpu_names, gpu_devices and gpu_contexts to read."""
    binary = which("nvidia-smi")
    started = {}
    if binary and names:
        started["names"] = Started([binary, *GPU_NAMES_ARGS])
    if binary and devices:
        started["devices"] = Started([binary, *GPU_QUERY_ARGS])
    if binary and contexts:
        started["contexts"] = Started([binary, *GPU_CONTEXTS_ARGS])
    return started


def gpu_contexts(started=None):
    """({GPU uuid: [MiB of each context]}, error): no PIDs are asked for or kept."""
    binary = which("nvidia-smi")
    if not binary:
        return {}, "nvidia-smi not found"
    rc, out, err = started.result() if started else run([binary, *GPU_CONTEXTS_ARGS])
    if rc != 0:
        return {}, (err.strip() or out.strip() or "nvidia-smi exited %d" % rc)
    contexts: dict[str, list[Any]] = {}
    for line in out.splitlines():
        parts = [part.strip() for part in line.split(",")]
        if len(parts) == 2 and parts[0]:
            contexts.setdefault(parts[0], []).append(as_int(parts[1]))
    return contexts, None


def shared_from_outside(devices, held, wanted, contexts):
    """GPUs of `wanted` held here that have more contexts than processes here holding them:
    someone outside the container uses them too (stopping the old run would not free them)."""
    shared = []
    for d in devices:
        here = sum(1 for gpus in held.values() if d["index"] in gpus)
        count = len(contexts.get(d.get("uuid") or "", []))
        if d["index"] in wanted and here and count > here:
            shared.append(
                {"index": d["index"], "used_mib": d["used_mib"], "contexts": count, "here": here}
            )
    return shared


def gpu_names(started=None):
    """(names, error): one name per visible GPU from `nvidia-smi -L` (or its `started` run)."""
    binary = which("nvidia-smi")
    if not binary:
        return [], "nvidia-smi not found"
    rc, out, err = started.result() if started else run([binary, *GPU_NAMES_ARGS])
    if rc != 0:
        return [], (err.strip() or out.strip() or "nvidia-smi -L exited %d" % rc)
    names = []
    for line in out.splitlines():
        match = re.match(r"^GPU \d+: (.*?)(?: \(UUID: [^)]*\))?\s*$", line)
        if match:
            names.append(match.group(1))
    return names, None


def gpu_devices(started=None, timeout=30.0):
    """(devices, error): per GPU its index, memory used and total (MiB) and utilization (%)."""
    binary = which("nvidia-smi")
    if not binary:
        return [], "nvidia-smi not found"
    if started is not None:
        rc, out, err = started.result()
    else:
        rc, out, err = run([binary, *GPU_QUERY_ARGS], timeout=timeout)
    if rc != 0:
        return [], (err.strip() or out.strip() or "nvidia-smi exited %d" % rc)
    devices = []
    for line in out.splitlines():
        parts = [part.strip() for part in line.split(",")]
        if len(parts) != 5 or as_int(parts[0]) is None:
            continue
        devices.append(
            {
                "index": int(parts[0]),
                "uuid": parts[1],
                "used_mib": as_int(parts[2]),  # [N/A] on some boards: None
                "total_mib": as_int(parts[3]),
                "util": as_int(parts[4]),
            }
        )
    return devices, None


def gpu_device_holders(pids=None):
    """{pid: [GPU index, ...]}: the processes of this container with /dev/nvidia<N> open (what
    `fuser -v /dev/nvidia*` finds; CUDA keeps one handle per device it uses), container PIDs.
    `pids`: look at these only."""
    held = {}
    me = os.getpid()
    for pid in pids if pids is not None else proc_table():
        if pid == me:
            continue
        fd_dir = "/proc/%d/fd" % pid
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        gpus = set()
        for fd in fds:
            try:
                match = GPU_DEVICE.match(os.readlink(os.path.join(fd_dir, fd)))
            except OSError:
                continue
            if match:
                gpus.add(int(match.group(1)))
        if gpus:
            held[pid] = sorted(gpus)
    return held


def held_gpus(held):
    return set(g for gpus in held.values() for g in gpus)


def used_outside(devices, held, wanted):
    """GPUs of `wanted` with memory in use that no process of this container holds: another
    container (Proxmox passes the same /dev/nvidia* to several) or the host uses them."""
    mine = held_gpus(held)
    return [
        {"index": d["index"], "used_mib": d["used_mib"]}
        for d in devices
        if d["index"] in wanted and d["index"] not in mine and (d["used_mib"] or 0) > GPU_IDLE_MIB
    ]


def describe_outside(outside):
    """`GPU 3 (22512 MiB in use)`: GPUs used from outside the container."""
    parts = []
    for d in outside:
        if "contexts" in d:
            parts.append(
                "GPU %d (%s MiB in use by %d processes, %d of them in this container)"
                % (d["index"], d["used_mib"], d["contexts"], d["here"])
            )
        else:
            parts.append("GPU %d (%s MiB in use)" % (d["index"], d["used_mib"]))
    return ", ".join(parts)


def holder_entries(held):
    """Holders for answers and messages: container PID, name, GPUs, command line."""
    return [
        {"pid": pid, "name": proc_name(pid), "gpus": gpus, "command": process_command(pid)}
        for pid, gpus in sorted(held.items())
    ]


def proc_name(pid):
    try:
        with open("/proc/%d/comm" % pid) as f:
            return f.read().strip()
    except OSError:
        return "?"


def describe_holders(holders):
    """`pid 106 python3 (8 GPUs)`: one entry per process, however many GPUs it holds."""
    return ", ".join(
        "pid %s %s (%d GPU%s)"
        % (h["pid"], h["name"], len(h["gpus"]), "" if len(h["gpus"]) == 1 else "s")
        for h in holders
    )


def wanted_gpus(gpus, env=None):
    """The GPU indexes a run of `gpus` GPUs uses: CUDA_VISIBLE_DEVICES when it lists indexes,
    else the first `gpus`."""
    visible = (env or {}).get("CUDA_VISIBLE_DEVICES", "")
    listed = [as_int(part.strip()) for part in visible.split(",") if part.strip()]
    if listed and all(i is not None for i in listed):
        return set(listed)
    return set(range(max(gpus, 0)))


def gpu_report(wanted, holders=True, started=None, devices_started=None):
    if wanted <= 0:
        return {"visible": 0, "names": [], "error": None, "holders": [], "skipped": True,
                "outside": []}  # fmt: skip
    names, error = gpu_names(started)
    held, outside = {}, []
    if holders and not error:
        devices, error = gpu_devices(devices_started)
        held = gpu_device_holders()
        outside = used_outside(devices, held, set(range(len(names))))
    return {
        "visible": len(names),
        "names": names,
        "error": error,
        "holders": holder_entries(held),
        "skipped": False,
        "outside": outside,
    }


def poll_gpus(want, run, started):
    """What a poll tells about the run's GPUs, small: how many it should hold, those its
    processes hold, and per GPU [index, utilization %, memory used MiB]."""
    held = gpu_device_holders(run)
    devices, error = gpu_devices(started)
    return {
        "want": want,
        "held": sorted(held_gpus(held)),
        "devices": [[d["index"], d["util"], d["used_mib"]] for d in devices],
        "error": error[:200] if error else None,
    }


# --------------------------------------------------------------------------- lock


def read_lock_content(fd):
    os.lseek(fd, 0, os.SEEK_SET)
    data = b""
    while True:
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        data += chunk
    text = data.decode("utf-8", "replace").strip()
    if not text:
        return None
    try:
        content = json.loads(text)
    except ValueError:
        return {"raw": text[:200]}
    return content if isinstance(content, dict) else {"raw": text[:200]}


def describe_holder(holder):
    return "%s from %s (pid %s; in the container pid %s) since %s" % (
        holder.get("operator", "?"),
        holder.get("from_host", "?"),
        holder.get("client_pid", "?"),
        holder.get("agent_pid", "?"),
        holder.get("since", "?"),
    )


def lock_state(path):
    """Who holds the lock (preflight; no side effects): None, or the holder plus stale."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        holder = read_lock_content(fd)
        if holder is None:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            stale = False
        else:
            fcntl.flock(fd, fcntl.LOCK_UN)
            stale = True
        state = dict(holder)
        state["stale"] = stale
        return state
    finally:
        os.close(fd)


def write_lock(fd, text):
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, text.encode())
    os.fsync(fd)


class DeployLock:
    """flock on the lock file for this process's lifetime; the file says who holds it."""

    def __init__(self, path, operator):
        self.path = path
        self.operator = operator if isinstance(operator, dict) else {}
        self.fd = None

    def acquire(self, warnings, wait=0.0, progress=None):
        """Take the lock; held by another deploy, wait up to `wait` seconds for it (telling
        `progress` who holds it about once a second), then refuse."""
        os.makedirs(os.path.dirname(self.path) or "/", exist_ok=True)
        # os.open is close-on-exec: a tmux server started later must not inherit the lock.
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + max(0.0, wait)
        told = 0.0
        waited = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError:
                waited = True
                holder = read_lock_content(fd) or {}
                left = deadline - time.monotonic()
                if left <= 0:
                    os.close(fd)
                    how_long = " (waited %gs)" % wait if wait > 0 else ""
                    raise AgentError(
                        "locked",
                        "another deploy is running%s: %s" % (how_long, describe_holder(holder)),
                        holder=holder,
                    ) from None
                if progress is not None and time.monotonic() - told >= 1.0:
                    told = time.monotonic()
                    progress("waiting for the lock, %ds left: held by %s"
                             % (left, describe_holder(holder)))  # fmt: skip
                time.sleep(min(0.2, left))
        self.fd = fd
        previous = read_lock_content(fd)
        if previous:
            # flock dies with its process, so content without a holder is a stale record.
            warnings.append("broke stale lock held by %s" % describe_holder(previous))
        write_lock(fd, json.dumps(self.content()))
        return waited

    def content(self):
        return {
            "operator": self.operator.get("user"),
            "from_host": self.operator.get("host"),
            "client_pid": self.operator.get("pid"),
            "agent_pid": os.getpid(),
            "since": utc_iso(),
        }

    def release(self):
        fd, self.fd = self.fd, None
        if fd is None:
            return
        try:
            write_lock(fd, "")
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)


# --------------------------------------------------------------------------- stop


def stop_run(session, grace, gpus, warnings, extra_pids=(), progress=None, wanted=()):
    """Ask (C-c), wait, kill the session, TERM then KILL what is left, confirm it is gone.

    `extra_pids` (GPU holders the operator asked to kill, container PIDs from /proc) are ended
    with the run's leftovers; `progress(detail)` hears how much of the grace period is left,
    about once a second. With `gpus`, it then waits for the run's processes to close their GPU
    devices and for the memory of the GPUs in `wanted` (the next run's) to fall."""
    state = session_state(session)
    pane_pid = state["pane_pid"]
    seen = run_pids(pane_pid, session) | set(extra_pids)
    report = stop_report(pane_active(state) or bool(seen), state["exists"], seen)
    if not state["exists"] and not seen:
        return report
    holders: dict[str, Started] = {}
    confirming: list[bool] = []  # once

    def confirm():
        """The run's processes have exited: nvidia-smi can start on the confirmation that
        they left the GPUs while the pane's end is noticed and the session goes."""
        if not confirming:
            confirming.append(True)
            holders.update(start_gpu_queries(False, gpus > 0))  # device facts only

    if pane_active(state):
        tmux(["send-keys", "-t", "=%s:" % session, "C-c"])
        # A session someone started by hand runs the trainer under an interactive shell, which
        # survives C-c: there the run is over when everything but that shell has exited.
        shell = pane_pid if state.get("run") is None and is_shell(pane_pid) else None

        def finished():
            seen.update(run_pids(pane_pid, session))
            if alive(seen - {shell}):
                return False
            confirm()
            return shell is not None or not pane_active(session_state(session))

        def waited_for():
            return alive(seen) - {shell}

        # forced: asking was not enough within the grace period.
        report["forced"] = not wait_for(
            finished, grace, on_tick=grace_countdown(grace, progress), pids=waited_for
        )
    if not report["forced"]:
        confirm()
    if state["exists"]:
        kill_session(session, warnings)
    seen.update(run_pids(pane_pid, session))
    # Killing the session sends SIGHUP: give what it ends a moment to exit before calling
    # anything left "forced" (an interactive shell, the pane's own process).
    wait_for(lambda: not alive(seen), 1.0, pids=lambda: alive(seen))
    report["pids"] = sorted(seen)
    report["forced"] = report["forced"] or bool(alive(seen))
    report["leftover"] = sorted(terminate(seen, grace))
    if report["leftover"] or report["forced"]:
        for query in holders.values():
            query.cancel()  # it saw processes that have been killed since
        holders.clear()
    if gpus > 0:
        # Memory is judged on the GPUs the next run needs only: an old run's GPU that another
        # container also uses is no reason to refuse a run that will not use it.
        ours, others, outside = gpu_release(
            seen, set(wanted), warnings, started=holders.get("devices")
        )
        report["gpu_holders"], report["gpu_others"] = holder_entries(ours), holder_entries(others)
        report["gpu_outside"] = outside
    return report


LAUNCH_RETRY_PAUSE = 0.5
# How long a tmux server that lost its last session may take to exit (it frees the panes' history
# first: a 100,000-line history or one 10 MB line takes it a while) before it is ended.
SERVER_EXIT_WAIT = 20.0


def kill_session(session, warnings, timeout=SERVER_EXIT_WAIT):
    """Kill the session; when it was the server's last one, return only once the server is gone.

    A server whose last session is killed exits on its own, but only after it has freed every
    pane: a client started meanwhile (the next launch) connects to the exiting server and fails
    with "server exited unexpectedly", leaving nothing running. Waiting for the server's pid to
    end closes that window. A server still there after `timeout` is left alone (a session may
    have been started on it since): the launch retries once."""
    rc, out, _ = tmux(["list-sessions", "-F", "#{pid}"])
    servers = set(as_int(line) for line in out.split()) - {None} if rc == 0 else set()
    tmux(["kill-session", "-t", "=%s" % session])
    if len(out.split()) != 1 or len(servers) != 1:
        return  # other sessions keep the server running: it does not exit
    server = set(servers)
    if wait_for(lambda: not alive(server), timeout, pids=lambda: alive(server)):
        return
    warnings.append(
        "tmux server %s still running %g s after its last session" % (min(server), timeout)
    )


def stop_report(was_running, session_existed, pids):
    return {
        "was_running": was_running,
        "session_existed": session_existed,
        "pids": sorted(pids),
        "forced": False,
        "leftover": [],
        "gpu_holders": [],
        "gpu_others": [],
        "gpu_outside": [],
    }


def terminate(pids, grace):
    """SIGTERM, short wait, SIGKILL; returns the pids still alive afterwards."""
    targets = alive(pids)
    if not targets:
        return set()
    signal_pids(targets, signal.SIGTERM)
    wait_for(lambda: not alive(targets), min(max(grace, 1.0), 10.0), pids=lambda: alive(targets))
    signal_pids(alive(targets), signal.SIGKILL)
    wait_for(lambda: not alive(targets), 5.0, pids=lambda: alive(targets))
    return alive(targets)


def gpu_release(pids, wanted, warnings, timeout=GPU_RELEASE_WAIT, started=None):
    """After a stop, wait (bounded) for `pids` to close their GPU device handles and for the
    memory of the `wanted` GPUs to fall: the driver frees an exited process's memory a moment
    after it exits. The first look may use a query `started` once the run had exited.

    Returns ({pid: GPUs} of `pids` still holding, {pid: GPUs} of other processes here holding
    `wanted` GPUs, `wanted` GPUs still used from outside the container)."""
    found: dict[str, Any] = {"ours": {}, "others": {}, "outside": [], "error": None}
    first = [started]

    def released():
        held = gpu_device_holders()
        found["ours"] = {pid: g for pid, g in held.items() if pid in pids}
        found["others"] = {pid: g for pid, g in held.items() if pid not in pids and wanted & set(g)}
        devices, found["error"] = gpu_devices(first.pop() if first else None)
        found["outside"] = used_outside(devices, held, wanted)
        return found["error"] is not None or not (found["ours"] or found["outside"])

    wait_for(released, timeout, interval=0.25)
    if found["error"]:
        warnings.append("could not confirm GPUs were released: %s" % found["error"])
    return found["ours"], found["others"], found["outside"]


def process_command(pid, limit=120):
    """The command line of `pid` for messages (cut to `limit`), or None when it is gone."""
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            text = f.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
    except OSError:
        return None
    return text if len(text) <= limit else text[: limit - 3] + "..."


def describe_processes(holders):
    """`pid 136 (python3 -c ...)`: GPU holders with their command lines, for refusals."""
    seen, parts = set(), []
    for holder in holders:
        if holder["pid"] in seen:
            continue
        seen.add(holder["pid"])
        command = holder.get("command") or process_command(holder["pid"]) or holder.get("name")
        parts.append("pid %s (%s)" % (holder["pid"], command))
    return ", ".join(parts)


# --------------------------------------------------------------------------- op: preflight


def op_preflight(request, warnings):
    workdir = workdir_param(request)
    session = session_param(request)
    dest = param(request, "dest", str, required=True)
    checkpoints = param(request, "checkpoints", str)
    gpus = param(request, "gpus", int, default=0)
    need = param(request, "need_bytes", int, default=0)
    workdir_info = prepare_workdir(workdir, param(request, "create_workdir", bool, default=False))
    free = free_bytes(workdir)
    if free is not None and need and free < need:
        warnings.append("only %d bytes free, %d needed" % (free, need))
    gpu_info = gpu_report(gpus)
    if gpus > 0 and gpu_info["visible"] < gpus:
        warnings.append("%d GPUs wanted, %d visible" % (gpus, gpu_info["visible"]))
    return {
        "python": PYTHON_VERSION,
        "tmux": tmux_version(),
        "workdir": workdir_info,
        "free_bytes": free,
        "gpus": gpu_info,
        "session": session_state(session),
        "dest_sha256": sha256_or_none(os.path.join(workdir, dest)),
        "checkpoints": checkpoints_info(
            workdir, checkpoints, protected_paths(workdir, session, os.path.join(workdir, dest))
        ),
        "lock": lock_state(param(request, "lock_path", str, default=LOCK_PATH)),
    }


def prepare_workdir(workdir, create):
    exists = os.path.isdir(workdir)
    created = False
    if create and not exists:
        os.makedirs(state_dir(workdir), exist_ok=True)
        exists = created = True
    elif create:
        os.makedirs(state_dir(workdir), exist_ok=True)
    writable = exists and os.access(workdir, os.W_OK | os.X_OK)
    return {"exists": exists, "writable": writable, "created": created}


def free_bytes(path):
    # The workdir may not exist yet: measure the filesystem it would be created on.
    while path and not os.path.exists(path):
        path = os.path.dirname(path)
    try:
        st = os.statvfs(path or "/")
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def checkpoints_info(workdir, rel, protected=()):
    if rel is None:
        return None
    path, unsafe = checkpoint_problem(workdir, rel, protected)
    return {"path": path, "exists": os.path.lexists(path), "unsafe": unsafe}


# --------------------------------------------------------------------------- op: apply


class Deploy:
    """The deploy transaction. Every check that can stop it runs before the first destructive
    step; after that, a failure still answers with the steps done so far."""

    def __init__(self, request, warnings):
        self.warnings = warnings
        self.workdir = workdir_param(request)
        self.session = session_param(request)
        # A project release (agent_release.py) may come without a script.
        project = bool(request.get("release"))
        self.dest_rel = param(request, "dest", str, required=not project)
        self.start_dir = self.workdir
        # The script comes either inline (base64, written here to a temp file) or pushed before
        # this call with `pct push` to `tmp`; no script at all when the client saw it in place.
        self.tmp = param(request, "tmp", str)
        self.content_b64 = param(request, "content_b64", str)
        self.sha256 = (param(request, "sha256", str, required=not project) or "").lower()
        self.restart = param(request, "restart", bool, default=False)
        self.expect_run = param(request, "expect_run", str)
        self.grace = grace_param(request)
        self.kill_gpu_holders = param(request, "kill_gpu_holders", bool, default=False)
        self.foreign_holders: list[dict[str, Any]] = []
        self.queries: dict[str, Started | None] = {}
        self.query_flags = (False, False, False)
        self.run_file_next = None
        self.checkpoints_rel = param(request, "checkpoints", str)
        self.mode = param(request, "checkpoint_mode", str, default="keep")
        self.keep_archives = param(request, "keep_archives", int, default=3)
        self.command = param(request, "command", str, required=True)
        self.env = env_param(request)
        self.width = param(request, "width", int, default=PANE_WIDTH)
        self.height = param(request, "height", int, default=PANE_HEIGHT)
        self.history_limit = param(request, "history_limit", int, default=HISTORY_LIMIT)
        self.gpus = param(request, "gpus", int, default=0)
        # Check disk space and GPUs here too, so a deploy needs no separate preflight call.
        self.check_resources = param(request, "check_resources", bool, default=False)
        self.need_bytes = param(request, "need_bytes", int, default=0)
        self.shell = param(request, "shell", str, default="/bin/sh")
        self.python = param(request, "python", str, default=sys.executable or "python3")
        self.record_base = param(request, "record", dict, default={})
        self.run_id = param(request, "run_id", str) or new_run_id()
        # plan: run every check, change nothing, and say what the deploy would do. keep_going:
        # (with plan) record a failed check and go on, so doctor can show them all.
        self.plan = param(request, "plan", bool, default=False)
        # Another deploy's lock: wait this long for it before refusing (--wait-lock).
        self.wait_lock = min(max(param(request, "wait_lock", float, default=0.0), 0.0), 7 * 86400.0)
        # events: each step (and the stop's countdown) as a JSON line on stderr as it happens.
        self.events = param(request, "events", bool, default=False)
        self.keep_going = self.plan and param(request, "keep_going", bool, default=False)
        self.content = None
        self.failures: list[AgentError] = []
        lock_path = param(request, "lock_path", str, default=LOCK_PATH)
        self.lock = DeployLock(lock_path, request.get("operator"))
        self.validate()
        self.steps: list[dict[str, Any]] = []
        self.destructive = False
        self.tmp_ok = False
        self.result: dict[str, Any] = {
            "steps": self.steps,
            "script": None,
            "stopped": None,
            "checkpoints": None,
            "launched": None,
            "record": None,
            "preflight": None,
        }

    def validate(self):
        if self.mode not in ("archive", "purge", "keep"):
            raise AgentError("invalid", "checkpoint_mode must be archive, purge or keep")
        if self.mode != "keep" and self.checkpoints_rel is None:
            raise AgentError("invalid", "checkpoint_mode %s needs checkpoints" % self.mode)
        if self.width < 20 or self.height < 5 or self.history_limit < 0 or self.keep_archives < 0:
            raise AgentError(
                "invalid", "width, height, history_limit or keep_archives out of range"
            )
        if not self.command.strip():
            raise AgentError("invalid", "command is empty")
        if len(self.command.encode()) > COMMAND_LIMIT:
            raise AgentError(
                "invalid",
                "command is %d bytes; at most %d can be run"
                % (len(self.command.encode()), COMMAND_LIMIT),
            )
        for key, value in sorted(self.env.items()):
            size = len(key.encode()) + len(value.encode()) + 2  # "KEY=value" and its NUL
            if size > ARG_STRLEN:
                raise AgentError(
                    "invalid",
                    "env %s is %d bytes as KEY=value; exec takes at most %d for one string "
                    "(MAX_ARG_STRLEN): put large values in a file the trainer reads"
                    % (key, size, ARG_STRLEN),
                )
        env_bytes = sum(len(k.encode()) + len(v.encode()) + 2 for k, v in self.env.items())
        if env_bytes > ENV_LIMIT:
            raise AgentError(
                "invalid",
                "env is %d bytes; at most %d fit a process environment (put large values in a "
                "file the trainer reads)" % (env_bytes, ENV_LIMIT),
            )

    # -- driver

    def checks(self):
        """Every check that can stop the deploy, in order; none of them changes anything that
        matters (the inline script goes to a temp file, the lock is taken)."""
        checks = [("paths", self.check_paths)]
        if self.content_b64 is not None:
            checks.append(("receive", self.receive))
        checks += [
            ("lock", self.take_lock),
            ("tmux", self.check_tmux),
            ("active_check", self.check_active),
            ("verify", self.verify_sha),
            ("compile", self.compile_check),
            ("checkpoint_guard", self.guard_checkpoints),
            ("launch_check", self.check_launch),
        ]
        # Last, so that the nvidia-smi queries (started with the transaction; slow on a real
        # 8-GPU host) answer while the checks above run.
        if self.check_resources:
            checks.append(("resources", self.check_disk_and_gpus))
        if self.gpus > 0:
            checks.append(("gpus", self.check_gpu_holders))
        return checks

    def run(self):
        try:
            checks = self.checks()
            names = [name for name, _ in checks]
            # nvidia-smi and tmux -V answer while the checks before their own run (they read).
            self.query_flags = ("resources" in names, "gpus" in names, "gpus" in names)
            self.start_queries()
            for name, check in checks:
                try:
                    self.step(name, check)
                except AgentError as exc:
                    if not self.keep_going:
                        raise
                    self.failures.append(exc)
                if name == "lock" and not self.plan:
                    self.remove_stale_temps()
            if self.failures:
                raise self.failures[0]
            if self.plan:
                self.plan_actions()
                return None, self.result
            self.step("install", self.install)
            self.step("stop", self.stop_old)
            try:
                self.step("checkpoints", self.set_checkpoints_aside)
                self.step("launch", self.launch)
            except AgentError as exc:
                raise self.run_down(exc) from None  # the old run is stopped: say what is left
            self.step("record", self.write_record)
            error = None
        except AgentError as exc:
            error = exc
            if self.destructive and self.result["record"] is None:
                self.try_record_failure(exc)
        finally:
            self.cleanup()
        return error, self.result

    def plan_actions(self):
        """What the deploy would change, as `planned` steps (from the checks' view of the CT)."""
        planned = []
        if getattr(self, "dest", None) is not None:
            unchanged = sha256_or_none(self.dest) == self.sha256
            planned.append(("install", "%s %s" % (self.dest, "unchanged" if unchanged else
                            "replaced (the old one kept as .prev)")))  # fmt: skip
        if pane_active(self.old_state) or self.old_pids or self.foreign_holders:
            planned.append(("stop", "session '%s' (pane pid %s): C-c, wait %g s, kill the session "
                            "and what is left of the run" % (self.session,
                            self.old_state["pane_pid"], self.grace)))  # fmt: skip
        else:
            planned.append(("stop", "nothing to stop: no active session '%s'" % self.session))
        where = self.checkpoints
        if where is None or self.mode == "keep":
            planned.append(("checkpoints", "keep %s for a resume" % where))
        elif not os.path.lexists(where):
            planned.append(("checkpoints", "nothing to set aside at %s" % where))
        elif self.mode == "purge":
            planned.append(("checkpoints", "DELETE %s" % where))
        else:
            planned.append(("checkpoints", "move %s to %s.archived-<UTC time>, keep %d"
                            % (where, where, self.keep_archives)))  # fmt: skip
        planned.append(("launch", "tmux session '%s' in %s: %s"
                        % (self.session, self.workdir, self.command)))  # fmt: skip
        planned.append(("record", os.path.join(state_dir(self.workdir), "deploys.jsonl")))
        for name, detail in planned:
            self.steps.append({"name": name, "status": "planned", "detail": detail})

    def step(self, name, action):
        started = time.monotonic()
        try:
            status, detail = action()
        except AgentError as exc:
            self.steps.append(
                {"name": name, "status": "failed", "detail": exc.message, "kind": exc.kind}
            )
            self.emit_step()
            raise
        except Exception as exc:  # an unexpected error still answers with the steps so far
            message = "%s: %s" % (type(exc).__name__, exc)
            self.steps.append(
                {"name": name, "status": "failed", "detail": message, "kind": "failed"}
            )
            self.emit_step()
            raise AgentError("failed", "%s failed: %s" % (name, message)) from exc
        seconds = round(time.monotonic() - started, 3)
        self.steps.append({"name": name, "status": status, "detail": detail, "seconds": seconds})
        self.emit_step()

    def start_queries(self):
        self.queries = start_gpu_queries(*self.query_flags)
        self.queries["tmux"] = start_tmux_version()

    def emit_step(self):
        if self.events:
            emit_event({"event": "step", "step": self.steps[-1]})

    def cleanup(self):
        for query in self.queries.values():  # a check failed before reading it
            if query is not None:
                query.cancel()
        # The pushed temp file never outlives the transaction; only removed once proven ours.
        if self.tmp_ok:
            remove_quietly(self.tmp)
        if self.run_file_next:
            remove_quietly(self.run_file_next)
        try:
            self.lock.release()
        except OSError as exc:
            self.warnings.append("could not release the lock: %s" % exc)

    # -- checks (nothing destructive)

    def receive(self):
        """Write the inline script next to where it will live (same filesystem: mv is a rename)."""
        if self.tmp is not None:
            raise AgentError("invalid", "give either tmp or content_b64, not both")
        try:
            data = base64.b64decode(self.content_b64, validate=True)
        except (ValueError, TypeError) as exc:
            raise AgentError(
                "corrupt", "transfer corrupted: the script is not valid base64: %s" % exc
            ) from None
        if self.plan:
            self.content = data
            return "ok", "%d bytes received (plan: kept in memory)" % len(data)
        os.makedirs(state_dir(self.workdir), exist_ok=True)
        name = ".%s.launcher-%s.tmp" % (os.path.basename(self.dest_rel), random_hex(12))
        path = os.path.join(self.workdir, name)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        self.tmp, self.tmp_ok = path, True  # ours from here on: removed on any failure
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        return "ok", "%d bytes to %s" % (len(data), path)

    def check_paths(self):
        # workdir_param already refused a workdir that resolves to / or a system directory.
        self.dest = dest_path(self.workdir, self.dest_rel)
        if self.tmp is not None:
            self.tmp = tmp_path(self.workdir, self.tmp)
            # Proven inside the workdir: from here on the temp file is ours to remove on failure.
            self.tmp_ok = True
        # (A dest in the checkpoints is refused by the checkpoint guard: it protects the script.)
        reason = dest_problem(self.workdir, self.dest)
        if reason:
            raise AgentError(
                "unsafe_path", "script destination %r is refused: %s" % (self.dest_rel, reason)
            )
        return "ok", self.dest

    def remove_stale_temps(self):
        """Temp files of earlier deploys that were killed mid-way (kill -9, a dropped link).

        Runs under the lock, so no other deploy's transaction is using them."""
        removed = []
        name = os.path.basename(self.dest)
        prefixes = (".%s.launcher-" % name,)
        for directory in sorted({self.workdir, os.path.dirname(self.dest)}):
            for entry in list_dir(directory):
                full = os.path.join(directory, entry)
                if not (entry.startswith(prefixes) and entry.endswith(".tmp")) or full == self.tmp:
                    continue
                if os.path.islink(full) or not os.path.isfile(full):
                    continue
                remove_quietly(full)
                removed.append(full)
        state = state_dir(self.workdir)
        for entry in list_dir(state):
            if entry.startswith(self.session + ".run.next"):
                remove_quietly(os.path.join(state, entry))
        if removed:
            self.steps.append(
                {"name": "leftovers", "status": "ok", "seconds": 0.0,
                 "detail": "removed %d stale temp file(s) of killed deploys: %s"
                 % (len(removed), ", ".join(removed))}
            )  # fmt: skip
            self.emit_step()

    def take_lock(self):
        if self.plan:
            holder = lock_state(self.lock.path)
            if holder and not holder["stale"]:
                raise AgentError(
                    "locked", "another deploy is running: %s" % describe_holder(holder),
                    holder=holder,
                )  # fmt: skip
            return "ok", "%s free (plan: not taken)" % self.lock.path
        progress = None
        if self.events:

            def progress(detail):
                emit_event({"event": "progress", "name": "lock", "detail": detail})

        if self.lock.acquire(self.warnings, wait=self.wait_lock, progress=progress):
            # The queries started with the transaction saw the containers as they were before
            # the deploy that held the lock: its run's GPUs would look held from outside.
            for query in self.queries.values():
                if query is not None:
                    query.cancel()
            self.start_queries()
        return "ok", self.lock.path

    def check_tmux(self):
        version = tmux_version(self.queries.get("tmux"))
        if not version:
            raise AgentError("missing", "tmux is not installed in the container")
        return "ok", version

    def check_disk_and_gpus(self):
        free = free_bytes(self.workdir)
        # Who holds the GPUs is judged once the old run's processes are known (check_gpu_holders).
        gpus = gpu_report(self.gpus, holders=False, started=self.queries.get("names"))
        self.result["preflight"] = {
            "python": PYTHON_VERSION,
            "free_bytes": free,
            "gpus": gpus,
        }
        if free is not None and free < self.need_bytes:
            raise AgentError("missing", "only %d bytes free under %s" % (free, self.workdir))
        if self.gpus > 0 and gpus["visible"] < self.gpus:
            reason = gpus["error"] or "%d visible" % gpus["visible"]
            raise AgentError("missing", "playbook wants %d GPUs, %s" % (self.gpus, reason))
        detail = "python %s, %d MiB free" % (
            PYTHON_VERSION,
            (free or 0) // 2**20,
        )
        if self.gpus > 0:
            detail += ", %d GPUs" % gpus["visible"]
        return "ok", detail

    def check_gpu_holders(self):
        """Refuse to launch onto GPUs held by processes that are not the old run's (a child
        that double-forked out of the run, another job): stopping the run would not free them.
        Holders are this container's processes with /dev/nvidia<N> open; a GPU with memory in
        use and no holder here is used from outside (another CT, the host): nothing done here
        can free it, so that refuses whatever the options."""
        devices, error = gpu_devices(self.queries.get("devices"))
        if error:
            raise AgentError("missing", "cannot read the GPUs: %s" % error)
        held = gpu_device_holders()
        wanted = wanted_gpus(self.gpus, self.env)
        outside = used_outside(devices, held, wanted)
        contexts, contexts_error = gpu_contexts(self.queries.get("contexts"))
        if contexts_error:
            self.warnings.append("cannot count the GPUs' contexts: %s" % contexts_error)
        outside += shared_from_outside(devices, held, wanted, contexts)
        if outside:
            raise AgentError(
                "refused",
                "%s: used from outside this container (another container or the host; its "
                "processes cannot be seen or stopped from here); free %s there first"
                % (describe_outside(outside), "it" if len(outside) == 1 else "them"),
                gpus_outside=outside,
            )
        ours = holder_entries({p: g for p, g in held.items() if p in self.old_pids})
        self.foreign_holders = holder_entries(
            {p: g for p, g in held.items() if p not in self.old_pids and wanted & set(g)}
        )
        if self.foreign_holders and not self.kill_gpu_holders:
            raise AgentError(
                "refused",
                "GPUs are held by processes outside session '%s''s run: %s; stop them, or "
                "deploy with --kill-gpu-holders"
                % (self.session, describe_processes(self.foreign_holders)),
                holders=self.foreign_holders,
            )
        if self.foreign_holders:
            return "warning", "held by %s: killed with the old run" % describe_processes(
                self.foreign_holders
            )
        # Not this run's GPUs, but worth saying (doctor shows it): others use them from outside.
        rest = set(d["index"] for d in devices) - wanted
        elsewhere = used_outside(devices, held, rest)
        elsewhere += shared_from_outside(devices, held, rest, contexts)
        note = "; used from outside, not by this run: %s" % describe_outside(elsewhere)
        note = note if elsewhere else ""
        if ours:
            return "ok", "held by the old run (%s)%s" % (describe_holders(ours), note)
        return "ok", "free" + note

    def check_active(self):
        self.old_state = session_state(self.session)
        self.old_pids = run_pids(self.old_state["pane_pid"], self.session)
        if self.expect_run is not None and self.old_state.get("run") != self.expect_run:
            # Checked under the deploy lock: whoever replaced the run first is the only one.
            raise AgentError(
                "refused",
                "session '%s' %s %s (now %s): someone else replaced it"
                % (
                    self.session,
                    RUN_REPLACED,
                    self.expect_run,
                    self.old_state.get("run") or "nothing",
                ),
            )
        if self.restart:
            # Said as what is there: doctor plans with restart too, and asked for nothing.
            if pane_active(self.old_state) or self.old_pids:
                return "ok", "session '%s' is running: --restart replaces it" % (self.session)
            return "ok", "no active run"
        if pane_active(self.old_state):
            raise AgentError(
                "refused", "session '%s' is running; use --restart to replace it" % self.session
            )
        if self.old_pids:
            raise AgentError(
                "refused",
                "session '%s' has ended but processes of its run are alive (pids %s); use --restart"
                % (self.session, ", ".join(str(p) for p in sorted(self.old_pids))),
            )
        return "ok", "no active run"

    def verify_sha(self):
        if self.content is not None:
            got = hashlib.sha256(self.content).hexdigest()
            if got != self.sha256:
                raise AgentError(
                    "corrupt", "transfer corrupted: expected %s, got %s" % (self.sha256, got)
                )
            return "ok", got
        if self.tmp is None:
            got = sha256_or_none(self.dest)
            if got != self.sha256:
                raise AgentError(
                    "failed", "%s changed since the preflight (sha256 %s)" % (self.dest, got)
                )
            return "unchanged", "%s already in place" % got
        got = sha256_file(self.tmp)
        if got != self.sha256:
            raise AgentError(
                "corrupt", "transfer corrupted: expected %s, got %s" % (self.sha256, got)
            )
        return "ok", got

    def compile_check(self):
        if self.content is not None:
            source = self.content
        elif self.tmp is None:
            return "skipped", "script unchanged"
        else:
            with open(self.tmp, "rb") as handle:
                source = handle.read()
        if os.path.realpath(self.python) == os.path.realpath(sys.executable or ""):
            # The run's interpreter is this one: compile here, without a second start-up.
            try:
                compile(source, self.dest, "exec", dont_inherit=True)
            except SyntaxError as exc:
                raise AgentError("compile", syntax_message(self.dest, source, exc.lineno,
                                 exc.offset, exc.msg)) from None  # fmt: skip
            except ValueError as exc:  # e.g. NUL bytes
                raise AgentError("compile", "%s: %s" % (self.dest, exc)) from None
            return "ok", self.python
        rc, out, err = run([self.python, "-c", COMPILE, "-", self.dest], timeout=120, input=source)
        if rc == 3:
            try:
                line, column, message = json.loads(out.strip().splitlines()[-1])
            except (ValueError, IndexError, TypeError):
                line, column, message = None, None, out.strip()
            raise AgentError("compile", syntax_message(self.dest, source, line, column, message))
        if rc != 0:
            message = (err.strip() or out.strip()).splitlines()
            raise AgentError("compile", "\n".join(message[-12:]) or "compile exited %d" % rc)
        return "ok", self.python

    def guard_checkpoints(self):
        if self.checkpoints_rel is None:
            self.checkpoints = None
            return "skipped", "no checkpoints directory"
        self.checkpoints = self.safe_checkpoints()
        return "ok", self.checkpoints

    def safe_checkpoints(self):
        protected = protected_paths(self.workdir, self.session, self.dest)
        path, reason = checkpoint_problem(self.workdir, self.checkpoints_rel, protected)
        if reason:
            raise AgentError(
                "unsafe_path", "checkpoints path %r is unsafe: %s" % (self.checkpoints_rel, reason)
            )
        return path

    def check_launch(self):
        """Everything the launch needs, proven before the old run is stopped: the shell, the
        state directory and the run file (command and env, mode 0600) written and staged."""
        if not (os.path.isabs(self.shell) and os.access(self.shell, os.X_OK)):
            raise AgentError("missing", "shell %s is not executable in the container" % self.shell)
        if self.plan:
            existing = state_dir(self.workdir)
            while not os.path.exists(existing):
                existing = os.path.dirname(existing)
            if not os.access(existing, os.W_OK | os.X_OK):
                raise AgentError("missing", "%s is not writable: the run file cannot be written"
                                 % existing)  # fmt: skip
            return "ok", "%s writable; %d env value(s) go in a 0600 run file" % (
                existing,
                len(self.env),
            )
        os.makedirs(state_dir(self.workdir), exist_ok=True)
        marker = "%s:%s" % (self.session, self.run_id)
        self.run_file_next = run_file_path(self.workdir, self.session) + ".next"
        write_private(self.run_file_next, run_file_text(marker, self.command, self.env))
        self.dry_launch()
        with open(log_path(self.workdir, self.session), "a"):
            pass
        return "ok", "run file staged (%d env value(s), mode 0600)" % len(self.env)

    def dry_launch(self):
        argv = [self.shell, "-c", DRY_LAUNCH, "launcher-dry-launch", self.run_file_next, self.shell]
        try:
            rc, _, err = run(argv, timeout=10.0)
        except OSError as exc:
            rc, err = 126, str(exc)
        if rc != 0:
            raise AgentError(
                "invalid",
                "the run's environment cannot be started (a dry launch of %s with it failed, "
                "exit %s): %s" % (self.shell, rc, err.strip()[-500:]),
            )

    # -- destructive steps

    def install(self):
        self.destructive = True
        previous = sha256_or_none(self.dest)
        script: dict[str, Any] = {
            "path": self.dest,
            "sha256": self.sha256,
            "previous_sha256": previous,
        }
        script["unchanged"] = previous == self.sha256
        self.result["script"] = script
        if script["unchanged"]:
            if self.tmp is not None:
                remove_quietly(self.tmp)
            return "unchanged", "%s already has sha256 %s" % (self.dest, self.sha256)
        os.makedirs(os.path.dirname(self.dest), exist_ok=True)
        if previous:
            shutil.copy2(self.dest, self.dest + ".prev.tmp")
            os.replace(self.dest + ".prev.tmp", self.dest + ".prev")
        os.replace(self.tmp, self.dest)
        self.keep_history()
        return "ok", "installed %s" % self.dest

    def keep_history(self):
        history = os.path.join(state_dir(self.workdir), "scripts")
        os.makedirs(history, exist_ok=True)
        shutil.copy2(self.dest, os.path.join(history, self.sha256 + ".py"))
        os.utime(os.path.join(history, self.sha256 + ".py"))
        entries = [os.path.join(history, n) for n in os.listdir(history) if n.endswith(".py")]
        entries.sort(key=os.path.getmtime, reverse=True)
        for old in entries[SCRIPT_HISTORY:]:
            remove_quietly(old)

    def stop_old(self):
        if not self.old_state["exists"] and not self.old_pids and not self.foreign_holders:
            self.result["stopped"] = stop_report(False, False, ())
            return "skipped", "no session '%s'" % self.session
        extra = set(h["pid"] for h in self.foreign_holders)
        progress = None
        if self.events:

            def progress(detail):
                emit_event({"event": "progress", "name": "stop", "detail": detail})

        report = stop_run(
            self.session,
            self.grace,
            self.gpus,
            self.warnings,
            extra_pids=extra,
            progress=progress,
            wanted=wanted_gpus(self.gpus, self.env) if self.gpus > 0 else (),
        )
        self.result["stopped"] = report
        if report["gpu_others"]:
            raise AgentError(
                "refused",
                "GPUs are still in use by %s; not launching onto busy GPUs"
                % describe_processes(report["gpu_others"]),
            )
        if report["gpu_outside"]:
            raise AgentError(
                "refused",
                "%s after the old run stopped: used from outside this container; not launching "
                "onto busy GPUs" % describe_outside(report["gpu_outside"]),
                gpus_outside=report["gpu_outside"],
            )
        if report["leftover"] or report["gpu_holders"]:
            raise AgentError(
                "failed",
                "old run did not stop: pids %s still alive"
                % ", ".join(
                    str(p) for p in report["leftover"] + [h["pid"] for h in report["gpu_holders"]]
                ),
            )
        pids = ", ".join(str(p) for p in report["pids"]) or "none"
        if report["forced"]:
            # Asking was not enough: the run was killed. Worth a look, so not a plain ok.
            return "warning", "forced: still running %g s after C-c, killed (pids %s)" % (
                self.grace,
                pids,
            )
        return "ok", "stopped after C-c (pids %s)" % pids

    def set_checkpoints_aside(self):
        action = {"action": self.mode, "from": self.checkpoints, "to": None}
        self.result["checkpoints"] = action
        if self.mode == "keep" or self.checkpoints is None:
            action["action"] = "keep"
            return "skipped", "checkpoints kept"
        if not os.path.lexists(self.checkpoints):
            action["action"] = "none"
            return "skipped", "nothing to set aside"
        # Checked again right before the move: the tree may have changed since the guard.
        self.safe_checkpoints()
        if self.mode == "purge":
            remove_tree(self.checkpoints)
            return "ok", "purged %s" % self.checkpoints
        action["to"] = archive_name(self.checkpoints)
        os.rename(self.checkpoints, action["to"])
        action["pruned"] = prune_archives(
            self.checkpoints, self.keep_archives, self.warnings, self.workdir
        )
        return "ok", "archived to %s" % action["to"]

    def launch(self):
        os.makedirs(state_dir(self.workdir), exist_ok=True)
        remove_quietly(exit_path(self.workdir, self.session))
        remove_quietly(stopped_path(self.workdir, self.session))
        os.replace(str(self.run_file_next), run_file_path(self.workdir, self.session))
        self.run_file_next = None
        marker = "%s:%s" % (self.session, self.run_id)
        # The log is appended across runs: mark where this one starts.
        with open(log_path(self.workdir, self.session), "a") as log:
            log.write("\n=== launcher run %s at %s ===\n" % (marker, utc_iso()))
        rc, out, err = tmux(self.launch_args(marker))
        if rc != 0:
            # Once more, on a clean slate: the old run is already stopped, so giving up here
            # leaves nothing running. What the failed chain created of the session goes first.
            self.warnings.append("launch failed (%s): retrying once" % err.strip())
            if session_state(self.session)["exists"]:
                kill_session(self.session, self.warnings)
            time.sleep(LAUNCH_RETRY_PAUSE)
            rc, out, err = tmux(self.launch_args(marker))
        if rc != 0:
            raise AgentError("failed", "tmux could not start the session: %s" % err.strip())
        parts = out.strip().split()
        pane_pid = as_int(parts[1]) if len(parts) > 1 else None
        width = as_int(parts[2]) if len(parts) > 2 else None
        if width != self.width:
            self.warnings.append("pane is %s columns wide, not %d" % (width, self.width))
        self.result["launched"] = {
            "session": self.session,
            "pane_pid": pane_pid,
            "log_file": log_path(self.workdir, self.session),
            "exit_file": exit_path(self.workdir, self.session),
            "width": width,
            "run": marker,
        }
        return "ok", "session %s, pane pid %s" % (self.session, pane_pid)

    def run_down(self, exc):
        """The error of a launch (or the checkpoint move before it) that failed after the stop:
        nothing is running, so say so, with what was stopped and where the checkpoints are."""
        stopped = self.result["stopped"] or {}
        if stopped.get("was_running"):
            pids = ", ".join(str(p) for p in stopped.get("pids") or ()) or "none left"
            was = "the old run was stopped (pids %s)" % pids
        else:
            was = "no run was running before"
        moved = self.result["checkpoints"] or {}
        action = moved.get("action")
        if action == "archive":
            where = "checkpoints archived to %s" % moved.get("to")
        elif action == "purge":
            where = "checkpoints purged from %s" % moved.get("from")
        elif self.checkpoints is not None:
            where = "checkpoints left in %s" % self.checkpoints
        else:
            where = "no checkpoints directory"
        # A refusal keeps its kind (and exit code); a plain failure is "down", not unreachable.
        return AgentError(
            "down" if exc.kind == "failed" else exc.kind,
            "run is down: session '%s' is not running: %s; %s; %s failed: %s"
            % (self.session, was, where, self.steps[-1]["name"], exc.message),
        )

    def launch_args(self, marker):
        """One tmux command chain, so the session never exists half-configured.

        history-limit only applies to panes created after it is set, so the session starts with
        a placeholder window, gets its options, then the real window, then loses the placeholder.
        remain-on-exit is set in the same chain, before the server can notice a t=0 crash.
        """
        s = self.session
        # No value of the run's own is in this argv: it lands in the tmux server's command line
        # and in #{pane_start_command}, readable by anyone. The run file carries them.
        command = [self.shell, "-c", RUNNER, "launcher-run", run_file_path(self.workdir, s)]
        command += [exit_path(self.workdir, s), self.shell]
        if tmux_version_tuple(tmux_version()) < (3, 0):
            command = [shlex.join(command)]  # tmux < 3.0 runs a single string through a shell
        pipe = "cat >> %s" % shlex.quote(log_path(self.workdir, s))
        start_dir = format_escape(self.start_dir)
        chain = [
            ["new-session", "-d", "-s", s, "-n", PLACEHOLDER_WINDOW, "-c", start_dir,
             "-x", str(self.width), "-y", str(self.height), "sleep", "600"],
            ["set-option", "-t", "=%s:" % s, "history-limit", str(self.history_limit)],
            ["set-option", "-t", "=%s:" % s, "@launcher_run", marker],
            ["new-window", "-t", "=%s:" % s, "-n", RUN_WINDOW, "-c", start_dir, "-P", "-F",
             "#{pane_id} #{pane_pid} #{pane_width}", "--", *command],
            ["set-option", "-w", "-t", "=%s:{end}" % s, "remain-on-exit", "on"],
            ["pipe-pane", "-o", "-t", "=%s:{end}" % s, format_escape(pipe)],
            ["kill-window", "-t", "=%s:{start}" % s],
        ]  # fmt: skip
        args: list[str] = []
        for command_args in chain:
            args += (";",) if args else ()
            args += [tmux_arg(a) for a in command_args]
        return args

    def write_record(self):
        record = self.build_record("launched")
        append_record(self.workdir, record)
        self.result["record"] = record
        return "ok", os.path.join(state_dir(self.workdir), "deploys.jsonl")

    def build_record(self, outcome):
        record = dict(self.record_base)
        script = self.result["script"] or {}
        record.update(
            {
                "time": utc_iso(),
                "session": self.session,
                "run": "%s:%s" % (self.session, self.run_id),
                "outcome": outcome,
                "sha256": self.sha256,
                "previous_sha256": script.get("previous_sha256"),
                "stopped": self.result["stopped"],
                "checkpoints": self.result["checkpoints"],
                "launched": self.result["launched"],
            }
        )
        return record

    def try_record_failure(self, exc):
        try:
            record = self.build_record("failed: %s" % exc.message)
            append_record(self.workdir, record)
            self.result["record"] = record
        except Exception as record_exc:
            self.warnings.append("could not record the failed deploy: %s" % record_exc)


def syntax_message(dest, source, line, column, message):
    """`File "dest", line N` with that line quoted from the NEW script (not the installed one)."""
    text = "%s: %s" % (dest, message)
    if not line:
        return text
    lines = source.decode("utf-8", "replace").splitlines()
    quoted = lines[line - 1] if 0 < line <= len(lines) else ""
    text = 'File "%s", line %d\n    %s' % (dest, line, quoted.strip())
    if column and quoted:
        indent = len(quoted) - len(quoted.lstrip())
        text += "\n    " + " " * max(column - 1 - indent, 0) + "^"
    return text + "\nSyntaxError: %s" % message


def new_run_id():
    return "%s-%s" % (utc_now().strftime("%Y%m%dT%H%M%SZ"), random_hex(8))


def archive_name(path):
    base = "%s.archived-%s" % (path, utc_now().strftime("%Y%m%dT%H%M%SZ"))
    candidate, n = base, 1
    while os.path.lexists(candidate):  # two deploys within one second
        candidate, n = "%s-%d" % (base, n), n + 1
    return candidate


def prune_archives(path, keep, warnings, workdir):
    parent, name = os.path.split(path)
    prefix = name + ".archived-"
    archives = sorted((n for n in os.listdir(parent) if n.startswith(prefix)), reverse=True)
    pruned = []
    real_workdir = os.path.realpath(workdir)
    for old in archives[keep:]:
        full = os.path.join(parent, old)
        if os.path.islink(full) or not is_strict_child(os.path.realpath(full), real_workdir):
            warnings.append("left %s alone: it is a symlink or outside the workdir" % full)
            continue
        remove_tree(full)
        pruned.append(full)
    return pruned


def remove_tree(path):
    # Never follows a symlink: the guard already refused one, this is the last line of defence.
    # rmtree does not follow symlinks inside the tree either (fd-based on Linux).
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    else:
        os.unlink(path)


def append_record(workdir, record):
    directory = state_dir(workdir)
    os.makedirs(directory, exist_ok=True)
    line = json.dumps(record, sort_keys=True)
    with open(os.path.join(directory, "deploys.jsonl"), "a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())
    write_atomic(os.path.join(directory, "current.json"), json.dumps(record, indent=2) + "\n")


def op_apply(request, warnings):
    return run_to_the_end(Deploy(request, warnings))


def run_to_the_end(deploy):
    """Run a deploy transaction (a `Deploy` or a release's); a client that disconnects mid-way
    must not leave half a deploy behind: it finishes regardless."""
    saved = {
        signal.SIGHUP: signal.signal(signal.SIGHUP, ignore_hangup),
        signal.SIGPIPE: signal.signal(signal.SIGPIPE, signal.SIG_IGN),
    }
    try:
        error, result = deploy.run()
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
    if error:
        raise AgentError(error.kind, error.message, data=result, **error.extra)
    return result


# --------------------------------------------------------------------------- ops: stop, poll


def op_stop(request, warnings):
    session = session_param(request)
    grace = grace_param(request)
    gpus = param(request, "gpus", int, default=0)
    # The GPUs the playbook's run uses, so that `stop` says whether they are free for the next.
    visible = param(request, "cuda_visible_devices", str, default="")
    wanted = wanted_gpus(gpus, {"CUDA_VISIBLE_DEVICES": visible}) if gpus > 0 else ()
    lock = DeployLock(param(request, "lock_path", str, default=LOCK_PATH), request.get("operator"))
    # A stop racing a deploy's launch would leave either run half-dead: serialise on the lock.
    lock.acquire(warnings)
    try:
        report = stop_run(session, grace, gpus, warnings, wanted=wanted)
        workdir = request.get("workdir")
        if workdir and (report["session_existed"] or report["pids"]):
            mark_stopped(workdir_param(request), session, request.get("operator"), warnings)
        return {"stopped": report}
    finally:
        lock.release()


def mark_stopped(workdir, session, operator, warnings):
    """Leave the stop marker (see stopped_path); a run's state says `stopped` while it lasts."""
    try:
        os.makedirs(state_dir(workdir), exist_ok=True)
        who = operator if isinstance(operator, dict) else {}
        write_atomic(stopped_path(workdir, session), json.dumps({"time": utc_iso(), **who}) + "\n")
    except OSError as exc:
        warnings.append("could not record the stop: %s" % exc)


def op_poll(request, warnings):
    workdir = workdir_param(request)
    session = session_param(request)
    lines = param(request, "lines", int, default=200)
    gpus = param(request, "gpus", int, default=0)
    # nvidia-smi can take a second on 8 GPUs: it runs while the pane is captured, bounded.
    binary = which("nvidia-smi") if gpus > 0 else None
    started = Started([binary, *GPU_QUERY_ARGS], POLL_GPU_TIMEOUT) if binary else None
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
        "gpus": poll_gpus(gpus, run_pids(state["pane_pid"], session), started) if gpus else None,
    }


POLL_GPU_TIMEOUT = 3.0  # s a poll waits for nvidia-smi at most


def read_exit_code(path):
    try:
        with open(path) as f:
            return as_int(f.read().strip())
    except OSError:
        return None


# --------------------------------------------------------------------------- ops: logs, follow


def read_json(path):
    """The parsed JSON object in `path`, or None when it is missing or unreadable."""
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def file_age(path):
    """Seconds since `path` was last written, or None when it does not exist."""
    try:
        return max(0.0, time.time() - os.stat(path).st_mtime)
    except OSError:
        return None


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


def clean_line(line):
    """A log line as a terminal would show it: no CR line ending, only the last CR overwrite."""
    line = line.rstrip("\r")
    return line.rpartition("\r")[2] if "\r" in line else line


def tail_file(path, count, block=65536):
    """(complete lines, partial last line, offset after the last newline) of the file's end.

    Reads backwards from the end, so a multi-gigabyte log costs only the blocks it needs.
    """
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        position, data = size, b""
        while position > 0 and data.count(b"\n") <= count:
            step = min(block, position)
            position -= step
            f.seek(position)
            data = f.read(step) + data
    complete, _, partial = data.rpartition(b"\n")
    offset = size - len(partial)
    lines = complete.decode("utf-8", "replace").split("\n") if b"\n" in data else []
    if position > 0:
        lines = lines[1:]  # the first one may be cut in the middle
    lines = [clean_line(line) for line in lines[-count:]] if count > 0 else []
    return lines, clean_line(partial.decode("utf-8", "replace")), offset


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
                    handle = open(path, "rb")  # noqa: SIM115 (closed in finally)
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
    """Deploy records from <workdir>/.launcher/deploys.jsonl, newest first."""
    workdir = workdir_param(request)
    limit = max(param(request, "limit", int, default=0), 0)
    path = os.path.join(state_dir(workdir), "deploys.jsonl")
    records, unreadable = [], 0
    try:
        with open(path, "rb") as f:
            lines = f.read().decode("utf-8", "replace").splitlines()
    except FileNotFoundError:
        lines = []
    for line in lines:
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            unreadable += 1
            continue
        if isinstance(record, dict):
            records.append(record)
        else:
            unreadable += 1
    if unreadable:
        warnings.append("%d unreadable line(s) in %s skipped" % (unreadable, path))
    records.reverse()
    return {"path": path, "records": records[:limit] if limit else records, "total": len(records)}


def op_rollback(request, warnings):
    """Put <dest>.prev back through the same transaction as apply (lock, guards, stop, launch,
    record), from a copy in the workdir that is verified (sha256, py_compile) like an upload."""
    workdir = workdir_param(request)
    dest = dest_path(workdir, param(request, "dest", str, required=True))
    previous = dest + ".prev"
    if os.path.islink(previous) or not os.path.isfile(previous):
        raise AgentError(
            "refused", "no previous version to roll back to: %s does not exist" % previous
        )
    sha = sha256_file(previous)
    directory, name = os.path.split(dest)
    tmp = os.path.join(directory, ".%s.launcher-rollback-%s.tmp" % (name, random_hex(12)))
    shutil.copy2(previous, tmp)
    record = dict(param(request, "record", dict, default={}))
    record.update({"rollback": True, "rolled_back_from": sha256_or_none(dest)})
    applied = dict(request)
    applied.update({"op": "apply", "tmp": tmp, "sha256": sha, "record": record})
    try:
        return op_apply(applied, warnings)
    finally:
        remove_quietly(tmp)  # the transaction moved or removed it; this covers an early refusal


# --------------------------------------------------------------------------- entry points

HANDLERS = {
    "preflight": op_preflight,
    "apply": op_apply,
    "stop": op_stop,
    "poll": op_poll,
    "logs": op_logs,
    "follow": op_follow,
    "history": op_history,
    "rollback": op_rollback,
}
# agent_release.py, bundled after this file, adds the release ops and checks the whole list.
assert set(HANDLERS) <= set(OPS), "protocol.OPS lists every op handled here"


def envelope(op, error, warnings, data):
    result = {"ok": error is None, "op": op, "error": error, "warnings": warnings}
    result.update(data or {})
    return result


def run_local(request):
    """Run one op and return its envelope (no printing): what main prints, for tests."""
    warnings: list[str] = []
    op = request.get("op") if isinstance(request, dict) else None
    if op not in HANDLERS:
        error = {"kind": "invalid", "message": "unknown op %r" % (op,)}
        return envelope(str(op), error, warnings, None)
    try:
        data = HANDLERS[op](request, warnings)
        return envelope(op, None, warnings, data)
    except AgentError as exc:
        data = exc.extra.pop("data", None)
        return envelope(op, exc.as_dict(), warnings, data)
    except Exception as exc:
        error = {"kind": "failed", "message": "%s: %s" % (type(exc).__name__, exc)}
        return envelope(op, error, warnings, None)


def main(request):
    if signal.getsignal(signal.SIGHUP) == signal.SIG_IGN:
        # Ignored by whoever started the agent: it stays ignored here, but as a caught signal,
        # so that what the agent starts gets the default (see ignore_hangup).
        signal.signal(signal.SIGHUP, ignore_hangup)
    result = run_local(request)
    streaming = isinstance(request, dict) and request.get("op") in STREAMING_OPS
    out = sys.stderr if streaming else sys.stdout
    try:
        out.write(json.dumps(result) + "\n")
        out.flush()
    except (BrokenPipeError, OSError):
        return 0  # the work is done; nobody is listening for the answer
    return 0


# --------------------------------------------------------------------------- bundle cache
# The client's loader (agentclient.LOADER) hands over the bundle it was sent and has just run, so
# that later calls can send only its sha256. Best effort: a cache that cannot be kept (read-only
# or full /run, a directory that is not ours) only means the bundle travels again. The loader
# hashes the bytes it reads before running them, so nothing stored here is trusted as it lies.

BUNDLE_FILE = r"^agent-[0-9a-f]{64}\.bundle$"
CODE_FILE = r"^agent-([0-9a-f]{64})\.[\w.-]+\.code$"  # <sha256>.<cache_tag>.code
BUNDLE_TMP = r"^\.agent-[0-9a-f]{64}\.(?:bundle|[\w.-]+\.code)\.[0-9a-f]{12}\.tmp$"
BUNDLES_KEPT = 3  # two launcher versions used side by side do not evict each other
BUNDLE_TMP_STALE = 60.0  # a temp file this old was left by a writer that died


def store_bundle(directory, text):
    """Cache `text` as <directory>/agent-<sha256>.bundle (mode 0600, the directory 0700 and
    ours) and prune older bundles; the path, or None when it could not be written."""
    try:
        data = text.encode("utf-8")
        if not private_dir(directory):
            return None
        path = os.path.join(directory, "agent-%s.bundle" % hashlib.sha256(data).hexdigest())
        write_whole(path, data)
        prune_bundles(directory, path)
        return path
    except Exception:  # the op runs whatever happened to its cache
        return None


def code_key(digest, payload):
    """What a cached compiled bundle starts with: binds the marshal `payload` to the bundle's
    sha256 and to this very interpreter (marshal and bytecode change between versions), and
    shows a corrupt file. agentclient.LOADER computes the same to check it."""
    return hashlib.sha256(("%s %s\0" % (digest, sys.version)).encode() + payload).digest()


def store_code(directory, text, codes):
    """Cache the compiled bundle (`codes`, the code objects of protocol.py and agent.py compiled
    from `text`) as <directory>/agent-<sha256>.<cache_tag>.code, so later calls skip compiling
    it; the path, or None when it could not be written."""
    try:
        tag = sys.implementation.cache_tag
        if not tag or not private_dir(directory):
            return None
        digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
        payload = marshal.dumps(tuple(codes))
        path = os.path.join(directory, "agent-%s.%s.code" % (digest, tag))
        write_whole(path, code_key(digest, payload) + payload)
        return path
    except Exception:  # the op runs whatever happened to its cache
        return None


def private_dir(directory):
    """Make `directory` (not its parents) mode 0700; False when it is not a real directory
    owned by this user (then it is left alone)."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(directory, 0o700)
    info = os.lstat(directory)
    if os.path.islink(directory) or not os.path.isdir(directory) or info.st_uid != os.geteuid():
        return False
    if info.st_mode & 0o777 != 0o700:
        os.chmod(directory, 0o700)  # e.g. made earlier by the deploy lock with the umask's mode
    return True


def write_whole(path, data):
    """`data` to `path` through a new 0600 temp file beside it: readers see the whole file or
    the old one, and a failed write (a full disk) leaves nothing behind."""
    tmp = os.path.join(
        os.path.dirname(path), ".%s.%s.tmp" % (os.path.basename(path), random_hex(12))
    )
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(tmp, flags, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def prune_bundles(directory, current):
    """Keep `current` and the newest others up to BUNDLES_KEPT, and the compiled copies of the
    bundles kept; drop the rest and temp files of dead writers."""
    bundles, codes, now = [], [], time.time()
    for name in os.listdir(directory):
        path = os.path.join(directory, name)
        with contextlib.suppress(OSError):
            if re.match(BUNDLE_FILE, name) and path != current:
                bundles.append((os.lstat(path).st_mtime, path))
            elif re.match(CODE_FILE, name):
                codes.append((name[6:70], path))
            elif re.match(BUNDLE_TMP, name) and now - os.lstat(path).st_mtime > BUNDLE_TMP_STALE:
                os.unlink(path)
    bundles.sort(reverse=True)
    dropped = bundles[BUNDLES_KEPT - 1 :]
    for _, path in dropped:
        with contextlib.suppress(OSError):
            os.unlink(path)
    kept = {os.path.basename(p)[6:-7] for _, p in bundles[: BUNDLES_KEPT - 1]}
    kept.add(os.path.basename(current)[6:-7])
    for digest, path in codes:
        if digest not in kept:
            with contextlib.suppress(OSError):
                os.unlink(path)


if __name__ == "__main__":
    sys.exit(main(json.loads(sys.stdin.readline())))
