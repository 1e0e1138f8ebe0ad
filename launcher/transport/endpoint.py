"""What every part of the SSH layer shares, and nothing else: where and how to connect
(`Endpoint`), what one remote command did (`CommandResult`), and how a command's failures are
worded, on a channel of its own, through a relay or a persisted connection alike.

A leaf: it imports no other launcher module but `errors`, so remote.py, relay.py and
persist.py can all depend on it without depending on one another.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from launcher.core.errors import CommandTimeout, ConnectError


@dataclass(frozen=True)
class CommandResult:
    """What one remote command did (modelled on invoke's Result)."""

    command: str
    exit_code: int
    stdout: bytes
    stderr: bytes
    duration: float

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    @property
    def out(self) -> str:
        return self.stdout.decode("utf-8", "replace")

    @property
    def err(self) -> str:
        return self.stderr.decode("utf-8", "replace")

    def tail(self, lines: int = 10) -> str:
        text = (self.err or self.out).rstrip("\n")
        return "\n".join(text.splitlines()[-lines:])


@dataclass(frozen=True)
class Endpoint:
    """Where and how to connect, after merging the inventory with ssh_config."""

    name: str
    hostname: str
    port: int
    user: str
    identity_files: tuple[str, ...]
    known_hosts: Path
    accept_new: bool
    jump: str | None  # ProxyJump as configured (hops by alias, nearest first)
    connect_timeout: float
    command_timeout: float
    proxy_command: str | None = None  # with its %-tokens expanded
    via: Endpoint | None = None  # the jump host this one is reached through (resolved)
    passphrase: Literal["agent", "prompt"] = "agent"
    max_sessions: int = 8  # commands at once on the connection (sshd's MaxSessions)
    control_persist: float = 0.0  # idle seconds a background process keeps it (persist.py)

    @property
    def known_hosts_key(self) -> str:
        return self.hostname if self.port == 22 else f"[{self.hostname}]:{self.port}"


# What a command that failed on the way raises, on a channel of its own or through a relay.
def busy_error(ep: Endpoint, wait: float | None, command: str) -> CommandTimeout:
    return CommandTimeout(
        f"{ep.name}: no free SSH session within {wait:g} s (max_sessions "
        f"{ep.max_sessions} all busy): {short(command)}"
    )


def deadline_error(ep: Endpoint, timeout: float | None, command: str) -> CommandTimeout:
    return CommandTimeout(
        f"{ep.name}: command did not finish within {timeout:g} s: {short(command)}"
    )


def idle_error(ep: Endpoint, idle_timeout: float | None, command: str) -> CommandTimeout:
    return CommandTimeout(f"{ep.name}: no output for {idle_timeout:g} s: {short(command)}")


def link_error(ep: Endpoint, reason: object) -> ConnectError:
    return ConnectError(f"{ep.name}: connection failed during a command: {reason}")


def short(command: str, limit: int = 120) -> str:
    return command if len(command) <= limit else command[: limit - 3] + "..."
