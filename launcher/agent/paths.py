# mypy: allow-untyped-calls
"""Paths in the workdir and the checks on them (by real paths, at the moment of use), and
the run's records there: the log, the exit file, the stop marker, the deploy history."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import time

from launcher.agent.base import (
    COMMAND_VAR,
    MARKER_VAR,
    AgentError,
    as_int,
    remove_quietly,
    write_atomic,
)
from launcher.agent.protocol import STATE_DIR

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


def run_file_text(marker, command, env, own=None):
    """The run file the runner sources: every value quoted by shlex, one assignment a line.
    `own` (launcher's RUN_ENV values) comes after the playbook's env, so it is what the run sees."""
    lines = ["# launcher run %s: read by the run's wrapper; mode 0600" % marker]
    lines.append("export %s=%s" % (MARKER_VAR, shlex.quote(marker)))
    lines += ["export %s=%s" % (k, shlex.quote(v)) for k, v in sorted(env.items())]
    lines += ["export %s=%s" % (k, shlex.quote(v)) for k, v in (own or {}).items()]
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
