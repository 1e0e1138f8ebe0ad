"""A host as workflows see it (container.HostConnection): its endpoint, commands and streams,
each carried by the runner `runners()` chooses, the one place that chooses.

In order, the first that takes the command (a runner that cannot raises Unavailable, and then
nothing ran):
  1. the persisted connection (persist.py), while this process holds no connection of its own
     (a command then imports no SSH library and makes no handshake);
  2. the relay (relay.py), once the command has several targets on the host (use_relay), for
     commands whose stdin is complete when they start;
  3. a channel of its own on this process's SSH connection (ssh.py), which always takes it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from launcher.core import collector
from launcher.transport.endpoint import CommandResult, Endpoint
from launcher.transport.runner import Runner, first_taker
from launcher.transport.ssh import SSHConnection

if TYPE_CHECKING:
    from launcher.transport.fabricview import OpenedConnection
    from launcher.transport.persist import PersistedRunner
    from launcher.transport.relay import Relay


def _discard(data: bytes) -> None:
    pass


class Connection:
    """One host's commands, whichever way they travel; closed by `close()`."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self.ssh = SSHConnection(endpoint)
        self._persisted: PersistedRunner | None = None
        if endpoint.control_persist > 0:  # else its client and frame format are not loaded
            from launcher.transport.persist import PersistedRunner

            self._persisted = PersistedRunner(endpoint)
        self._relay: Relay | None = None  # use_relay(): one channel carries every command
        self._lock = threading.Lock()

    def use_relay(self) -> None:
        """Carry this host's commands on one channel, through a relay on the host (the command
        has several targets there: see relay.py). Not for a persisted connection, whose
        process carries its commands through a relay of its own (persistserver.py)."""
        if self._persisted is not None:
            return
        from launcher.transport.relay import Relay

        with self._lock:  # targets may ask from several threads (watch)
            if self._relay is None:
                self._relay = Relay(self.ssh)

    def runners(self) -> list[Runner]:
        """The runners a command tries, in order (see the module's docstring)."""
        collector.resume()  # the command has started: see core/collector.py
        chosen: list[Runner] = []
        if self._persisted is not None and not self.ssh.connected:
            chosen.append(self._persisted)
        if self._relay is not None and not self._relay.unavailable:
            chosen.append(self._relay)
        chosen.append(self.ssh)
        return chosen

    # -- container.HostConnection ---------------------------------------------------------------
    def run(
        self, command: str, *, stdin: bytes | None = None, timeout: float | None = None
    ) -> CommandResult:
        """Run a shell command string on the host, with a deadline on the whole exchange."""
        limit = timeout if timeout is not None else self.endpoint.command_timeout
        return first_taker(
            self.runners(), lambda runner: runner.run(command, stdin=stdin, timeout=limit)
        )

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
    ) -> int:
        """Run a command and hand its output over as it arrives; returns its exit code.

        `timeout` bounds the whole command (None: no limit), `idle_timeout` the silence on both
        streams. With `close_stdin=False` the remote side's stdin stays open until the command
        is given up, so it can notice the client going away. On any exception, KeyboardInterrupt
        included, the command loses its pipes at once and the exception propagates."""
        return first_taker(
            self.runners(),
            lambda runner: runner.stream(
                command,
                on_stdout,
                on_stderr or _discard,
                stdin=stdin,
                close_stdin=close_stdin,
                timeout=timeout,
                idle_timeout=idle_timeout,
            ),
        )

    # -- the SSH connection itself --------------------------------------------------------------
    @property
    def fabric(self) -> OpenedConnection:
        """Fabric's Connection over this one, connected (for Fabric's own API)."""
        return self.ssh.fabric

    def connect(self) -> None:
        """Connect now rather than on first use (the same errors as a first use would raise)."""
        self.ssh.connect()

    def close(self) -> None:
        """For good: each runner ends its commands under way and refuses later ones."""
        if self._persisted is not None:
            self._persisted.close()
        if self._relay is not None:
            self._relay.close()
        self.ssh.close()

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
