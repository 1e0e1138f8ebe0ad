"""pct verbs over a host connection. Quoting for the host shell happens here and only here.

`pct exec VMID -- ARGV` hands argv to lxc-attach without a shell, and the host's login shell
parses the SSH command string once: so one `shlex.join` for the host, and plain argv inside.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Sequence
from typing import Protocol, cast

from launcher.errors import ContainerError, LauncherError
from launcher.transport.endpoint import CommandResult, Endpoint

NOT_RUNNING = re.compile(r"container '?(\d+)'? not running", re.IGNORECASE)
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
    if not argv:
        raise ValueError("argv must not be empty")
    for arg in argv:
        if "\x00" in arg:
            raise ValueError("arguments cannot contain NUL bytes")
    return shlex.join(["pct", "exec", str(vmid), "--", *argv])


# Runs on the host: stdin -> a private temp file -> `pct push` -> the temp file removed, whatever
# happens (also on a dropped connection). Values arrive as positional parameters, never glued in.
PUSH_SCRIPT = (
    "tmp=$(mktemp /tmp/.launcher-XXXXXXXXXX) || exit 1; trap 'rm -f \"$tmp\"' EXIT; "
    "trap 'exit 129' HUP; trap 'exit 130' INT; trap 'exit 143' TERM; "
    'cat > "$tmp" && pct push "$1" "$tmp" "$2" --perms "$3"'
)


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
        self, argv: Sequence[str], *, stdin: bytes | None = None, timeout: float | None = None
    ) -> CommandResult:
        """Run argv inside the container; a missing or stopped container raises ContainerError."""
        result = self.host.run(exec_command(self.vmid, argv), stdin=stdin, timeout=timeout)
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
    ) -> int:
        """Run argv inside the container, handing its output over as it arrives (see
        transport/connection.py); a missing or stopped container raises ContainerError."""
        host = cast(HostConnection, self.host)
        if not hasattr(host, "stream"):
            raise ContainerError(f"{self.label}: this connection cannot stream")
        tail = bytearray()

        def stderr(data: bytes) -> None:
            tail.extend(data)
            del tail[:-4096]  # enough to recognise pct's own errors
            on_stderr(data)

        code = host.stream(
            exec_command(self.vmid, argv),
            on_stdout,
            on_stderr=stderr,
            stdin=stdin,
            close_stdin=close_stdin,
            timeout=timeout,
            idle_timeout=idle_timeout,
        )
        self._raise_for_container(CommandResult("pct exec", code, b"", bytes(tail), 0.0))
        return code

    def push(self, data: bytes, ct_path: str, *, perms: str = "0644") -> CommandResult:
        """`data` to `ct_path` through a host temp file and `pct push`, in one host command.

        Callers verify the content: pct may exit 0 after a failed write."""
        result = self.host.run(push_command(self.vmid, ct_path, perms=perms), stdin=data)
        self._raise_for_container(result)
        if not result.ok:
            raise PushFailed(
                f"{self.label}: pct push to {ct_path} failed (exit {result.exit_code}): "
                f"{result.tail(3)}"
            )
        return result

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
    if not argv:
        raise ValueError("argv must not be empty")
    if any("\x00" in arg for arg in argv):
        raise ValueError("arguments cannot contain NUL bytes")
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
