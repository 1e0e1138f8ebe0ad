"""pct verbs over a host connection. Quoting for the host shell happens here and only here.

`pct exec VMID -- ARGV` hands argv to lxc-attach without a shell, and the host's login shell
parses the SSH command string once: so one `shlex.join` for the host, and plain argv inside.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, cast

from launcher.core.errors import ContainerError, LauncherError
from launcher.transport.endpoint import CommandResult, Endpoint

NOT_RUNNING = re.compile(
    r"container '?(\d+)'? not running|can only push files to a running CT", re.IGNORECASE
)
NO_CONFIG = re.compile(r"Configuration file '[^']*' does not exist")


class PushFailed(ContainerError):
    """`pct push` reported a failure (the container itself is there and running)."""


class HostShell(Protocol):
    """What the container layer needs from a host connection (a strict fake in unit tests)."""

    def run(
        self, command: str, *, stdin: bytes | None = None, timeout: float | None = None
    ) -> CommandResult: ...


class HostConnection(HostShell, Protocol):
    """What workflows need from a host connection: commands, streams and the endpoint's
    settings (deadlines). transport/connection.py's Connection is the real one; unit tests
    pass strict fakes."""

    @property
    def endpoint(self) -> Endpoint: ...

    def stream(
        self,
        command: str,
        on_stdout: Callable[[bytes], None],
        *,
        on_stderr: Callable[[bytes], None] | None = None,
        stdin: bytes | None = None,
        close_stdin: bool = True,
        timeout: float | None = None,
        idle_timeout: float | None = None,
    ) -> int: ...


def exec_command(vmid: int, argv: Sequence[str]) -> str:
    """The host command line that runs `argv` inside container `vmid`, quoted once."""
    _check_argv(argv)
    return shlex.join(["pct", "exec", str(vmid), "--", *argv])


# Runs on the host: `pct exec VMID -- ARGV STAMP`, STAMP being the host's clock (GNU date:
# seconds.nanoseconds) read by this shell before `pct` starts. A `pct` that stalls or a CT that
# is frozen (lxc-attach joins its frozen cgroup) delays what follows, not the stamp: the agent
# measures a request's deadline from it (protocol.py, `deadline`) on the same clock, since a
# container shares the host's kernel. Values arrive as positional parameters, never glued in.
STAMPED_EXEC = 'v=$1; shift; exec pct exec "$v" -- "$@" "$(date +%s.%N)"'
STAMPED_NAME = "launcher-agent"


def stamped_command(vmid: int, argv: Sequence[str]) -> str:
    """The host command line that runs `argv` (the agent) inside container `vmid` with the
    host's clock as its last argument, quoted once."""
    _check_argv(argv)
    return shlex.join(["sh", "-c", STAMPED_EXEC, STAMPED_NAME, str(vmid), *argv])


def split_stamped(command: str) -> tuple[int, list[str]] | None:
    """(vmid, argv) of a stamped_command line (the stamp not included), or None."""
    words = shlex.split(command)
    if words[:4] != ["sh", "-c", STAMPED_EXEC, STAMPED_NAME] or len(words) < 6:
        return None
    return int(words[4]), words[5:]


def _check_argv(argv: Sequence[str]) -> None:
    if not argv:
        raise ValueError("argv must not be empty")
    for arg in argv:
        if "\x00" in arg:
            raise ValueError("arguments cannot contain NUL bytes")


# Runs on the host: stdin -> a private temp file -> `pct push` -> the temp file removed, whatever
# happens (also on a dropped connection). Values arrive as positional parameters, never glued in.
PUSH_SCRIPT = (
    "tmp=$(mktemp /tmp/.launcher-XXXXXXXXXX) || exit 1; trap 'rm -f \"$tmp\"' EXIT; "
    "trap 'exit 129' HUP; trap 'exit 130' INT; trap 'exit 143' TERM; "
    'cat > "$tmp" && pct push "$1" "$tmp" "$2" --perms "$3"'
)


# What a successful `pct push` may print on stderr (pve-common src/PVE/RESTEnvironment.pm, the
# task's `TASK WARNINGS: N` control message); any other line there is the task's error.
TASK_WARNINGS = re.compile(r"^Task finished with \d+ warning\(s\)!$")

# Runs in the container (argv: path size sha256 ...): one JSON line per file, what is there.
# A path that is a symlink or not a regular file has no size: pushes write regular files only.
VERIFY_SCRIPT = r"""
import hashlib, json, os, stat, sys
args = sys.argv[1:]
for path in args[0::3]:
    try:
        st = os.lstat(path)
    except OSError as exc:
        print(json.dumps([path, None, exc.strerror]))
        continue
    if not stat.S_ISREG(st.st_mode):
        print(json.dumps([path, None, "not a regular file"]))
        continue
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    print(json.dumps([path, st.st_size, digest.hexdigest()]))
"""
VERIFY_TIMEOUT = 120.0  # hashing is ~500 MB/s; a push's pieces are a few hundred MB at most


@dataclass(frozen=True)
class Pushed:
    """A file pushed into the container and what it must hold."""

    path: str
    size: int
    sha256: str

    @classmethod
    def of(cls, path: str, data: bytes) -> Pushed:
        return cls(path, len(data), hashlib.sha256(data).hexdigest())


def task_error(stderr: str) -> str | None:
    """The error a `pct push` task printed on stderr, or None (pct exits 0 either way)."""
    lines = [line.strip() for line in stderr.splitlines()]
    errors = [line for line in lines if line and not TASK_WARNINGS.match(line)]
    return "; ".join(errors) if errors else None


def push_command(vmid: int, ct_path: str, *, perms: str) -> str:
    """The host command that pushes its stdin to `ct_path` in container `vmid`."""
    return shlex.join(["sh", "-c", PUSH_SCRIPT, "launcher-push", str(vmid), ct_path, perms])


class Container:
    """One LXC container on a Proxmox host."""

    def __init__(self, host: HostShell, vmid: int, *, label: str) -> None:
        self.host = host
        self.vmid = vmid
        self.label = label

    def exec(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes | None = None,
        timeout: float | None = None,
        stamped: bool = False,
    ) -> CommandResult:
        """Run argv inside the container (`stamped`: with the host's clock as its last
        argument, see STAMPED_EXEC); a missing or stopped container raises ContainerError."""
        line = stamped_command if stamped else exec_command
        result = self.host.run(line(self.vmid, argv), stdin=stdin, timeout=timeout)
        self._raise_for_container(result)
        return result

    def stream(
        self,
        argv: Sequence[str],
        on_stdout: Callable[[bytes], None],
        *,
        on_stderr: Callable[[bytes], None],
        stdin: bytes | None = None,
        close_stdin: bool = True,
        timeout: float | None = None,
        idle_timeout: float | None = None,
        stamped: bool = False,
    ) -> int:
        """Run argv inside the container, handing its output over as it arrives (see
        transport/connection.py; `stamped` as for exec); a missing or stopped container raises
        ContainerError."""
        host = cast(HostConnection, self.host)
        if not hasattr(host, "stream"):
            raise ContainerError(f"{self.label}: this connection cannot stream")
        tail = bytearray()

        def stderr(data: bytes) -> None:
            tail.extend(data)
            del tail[:-4096]  # enough to recognise pct's own errors
            on_stderr(data)

        line = stamped_command if stamped else exec_command
        code = host.stream(
            line(self.vmid, argv),
            on_stdout,
            on_stderr=stderr,
            stdin=stdin,
            close_stdin=close_stdin,
            timeout=timeout,
            idle_timeout=idle_timeout,
        )
        self._raise_for_container(CommandResult("pct exec", code, b"", bytes(tail), 0.0))
        return code

    def push(
        self, data: bytes, ct_path: str, *, perms: str = "0644", verify: bool = True
    ) -> CommandResult:
        """`data` to `ct_path` through a host temp file and `pct push`, in one host command;
        then (with `verify`) its size and sha256 checked inside the container.

        pct's exit status alone proves nothing: a push whose write fails prints the task's
        error on stderr and exits 0 (see task_error). The destination's directory must exist:
        pct creates no directory. Callers that push several files verify them in one call
        (verify=False here, then verify_pushed; a push that printed an error is checked here
        all the same)."""
        result = self.host.run(push_command(self.vmid, ct_path, perms=perms), stdin=data)
        self._raise_for_container(result)
        if not result.ok:
            raise PushFailed(
                f"{self.label}: pct push to {ct_path} failed (exit {result.exit_code}): "
                f"{result.tail(3)}"
            )
        error = task_error(result.err)
        if error is None and not verify:
            return result
        # The file decides, not what pct printed: a node with a broken locale makes every Perl
        # program warn on stderr ("perl: warning: Setting locale failed"), and a push can still
        # have worked. When the file is wrong, the task's error is the reason given.
        try:
            self.verify_pushed([Pushed.of(ct_path, data)])
        except PushFailed:
            if error is None:
                raise
            raise PushFailed(f"{self.label}: pct push to {ct_path} failed: {error[:300]}") from None
        return result

    def verify_pushed(self, files: Sequence[Pushed]) -> None:
        """Each pushed file's size and sha256 as seen inside the container, in one call."""
        if not files:
            return
        argv = ["python3", "-I", "-S", "-c", VERIFY_SCRIPT]
        for f in files:
            argv += [f.path, str(f.size), f.sha256]
        result = self.exec(argv, timeout=VERIFY_TIMEOUT)
        if not result.ok:
            raise PushFailed(
                f"{self.label}: could not check the pushed files (exit {result.exit_code}): "
                f"{result.tail(3)}"
            )
        seen = {}
        for line in result.out.splitlines():
            try:
                path, size, detail = json.loads(line)
            except ValueError:
                continue
            seen[path] = (size, detail)
        for f in files:
            size, detail = seen.get(f.path, (None, "not checked"))
            if size is None:
                raise PushFailed(f"{self.label}: pushed file {f.path} is not there: {detail}")
            if size != f.size or detail != f.sha256:
                raise PushFailed(
                    f"{self.label}: pushed file {f.path} holds {size} bytes (sha256 "
                    f"{str(detail)[:12]}…), not the {f.size} bytes sent (sha256 "
                    f"{f.sha256[:12]}…): transfer corrupted"
                )

    def _raise_for_container(self, result: CommandResult) -> None:
        if result.ok:
            return
        text = result.err + result.out
        if NOT_RUNNING.search(text):
            raise ContainerError(
                f"{self.label}: container {self.vmid} not running",
                hint=f"start it with: pct start {self.vmid}",
            )
        if NO_CONFIG.search(text):
            raise ContainerError(
                f"{self.label}: container {self.vmid} does not exist on the host",
                hint=missing_container_hint(self.host, self.vmid),
            )
        if result.exit_code == 127 and "pct" in text and "not found" in text:
            raise ContainerError(
                f"{self.label}: `pct` not found on the host: is it a Proxmox node?"
            )


def host_command(argv: Sequence[str]) -> str:
    """A plain command line for the host's shell (not in a container), quoted once."""
    _check_argv(argv)
    return shlex.join(argv)


# `pct list` answers from the node's own config files: seconds at most.
LIST_TIMEOUT = 15.0
LIST_SHOWN = 20  # containers named in a hint; the rest are counted


def host_containers(host: HostShell, timeout: float = LIST_TIMEOUT) -> list[tuple[str, ...]] | None:
    """The host's containers as `pct list` prints them: (vmid, status, name) each, or None
    when it cannot say. Its columns are VMID, Status, Lock (often blank) and Name
    (pve-container src/PVE/CLI/pct.pm, `list`)."""
    try:
        result = host.run(host_command(["pct", "list"]), timeout=timeout)
    except LauncherError:
        return None
    if not result.ok:
        return None
    rows: list[tuple[str, ...]] = []
    for line in result.out.splitlines()[1:]:
        parts = line.split()
        if len(parts) >= 2 and parts[0].isdigit():
            rows.append((parts[0], parts[1], parts[-1] if len(parts) >= 3 else ""))
    return rows


def missing_container_hint(host: HostShell, vmid: int) -> str:
    """What to do about a VMID the host does not have: the ones it has (`pct list`)."""
    rows = host_containers(host)
    if rows is None:
        return f"check the vmid ({vmid}) in the inventory against `pct list` on the host"
    if not rows:
        return "the host has no containers (`pct list` is empty): create one, or check the host"
    shown = ", ".join(
        f"{ct} ({status}{', ' + name if name else ''})" for ct, status, name in rows[:LIST_SHOWN]
    )
    more = f" and {len(rows) - LIST_SHOWN} more" if len(rows) > LIST_SHOWN else ""
    return f"containers on this host: {shown}{more}; set the target's vmid to one of them"
