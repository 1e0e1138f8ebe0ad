"""The seam every way of running a host command fits: `Runner` (run, stream, close).

Three implementations: a channel of its own on the host's SSH connection (`ssh.SSHConnection`),
the relay that carries several targets' commands on one channel (`relay.Relay`), and the
persisted connection's background process (`persist.PersistedRunner`). Which one a command
takes is decided in one place on the client, `connection.Connection.runners`; the persisted
connection's process tries its relay, then a channel (persistserver.py). Both hand the command
down that order with `first_taker`.

A leaf beside endpoint.py: the runners import it, it imports none of them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from launcher.transport.endpoint import CommandResult

Sink = Callable[[bytes], None]


class Unavailable(Exception):
    """This runner cannot take the command and nothing ran: the next one in line gets it."""


class Runner(Protocol):
    """What a way of running host commands offers (a command line built by container.py)."""

    def run(self, command: str, *, stdin: bytes | None, timeout: float) -> CommandResult:
        """The command's whole output and exit code, all within `timeout` seconds."""
        ...

    def stream(
        self,
        command: str,
        on_stdout: Sink,
        on_stderr: Sink,
        *,
        stdin: bytes | None,
        close_stdin: bool,
        timeout: float | None,
        idle_timeout: float | None,
    ) -> int:
        """Output handed to the sinks as it arrives (in this thread); the exit code. On any
        exception (a sink's included) the command loses its pipes, as on a dropped channel."""
        ...

    def close(self) -> None: ...


R = TypeVar("R")
T = TypeVar("T")


def first_taker(runners: Iterable[R], attempt: Callable[[R], T]) -> T:
    """`attempt` with each runner in turn until one takes the command (one that cannot raises
    Unavailable before anything ran). The last runner, a channel of its own, always takes it."""
    for runner in runners:
        try:
            return attempt(runner)
        except Unavailable:
            continue
    raise AssertionError("the SSH connection takes every command")


def run_by_streaming(
    runner: Runner, command: str, *, stdin: bytes | None, timeout: float
) -> CommandResult:
    """`run` for a runner whose one primitive is `stream`: the output collected."""
    out, err = bytearray(), bytearray()
    started = time.monotonic()
    code = runner.stream(
        command,
        out.extend,
        err.extend,
        stdin=stdin,
        close_stdin=True,
        timeout=timeout,
        idle_timeout=None,
    )
    duration = time.monotonic() - started
    return CommandResult(command, code, bytes(out), bytes(err), duration)


@dataclass
class ConnectionStats:
    """How commands travelled in this process (what tests and the bench count)."""

    connects: int = 0
    commands: int = 0  # channels opened
    relayed: int = 0  # commands carried by a relay (relay.py) instead
    persisted: int = 0  # commands carried by a persisted connection (persist.py)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def count(self, what: str) -> None:
        with self.lock:
            setattr(self, what, getattr(self, what) + 1)


STATS = ConnectionStats()
