# mypy: allow-untyped-calls
"""The deploy lock (`flock` on /run/launcher/deploy.lock): who holds it, waiting for it."""

from __future__ import annotations

import fcntl
import json
import os
import time

from launcher.agent.base import AgentError, utc_iso

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
