"""The SSH connection to one host, and the direct runner: a channel of its own per command.

Under it is paramiko's client (transport/sshopen.py); Fabric's `Connection` is built over it
only when asked for (`fabric`). paramiko and cryptography take ~0.1 s to import: they are
imported only when a connection is opened, so `--help`, `--version`, configuration errors and a
command through a persisted connection do not pay for them. Host keys are always checked;
connecting (TCP, banner, key exchange, auth, every jump host) ends within connect_timeout as a
whole, retries included (tenacity); every command is bounded; only the connect phase is retried.

Commands run on launcher's own channel code over paramiko's transport, not through invoke's
runner: stdin goes in one write (invoke copies a non-terminal stdin a byte per 10 ms) and a
stream has an idle deadline.
"""

from __future__ import annotations

import contextlib
import io
import logging
import select
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Literal

from launcher.core.errors import CommandTimeout, ConnectError, LauncherError
from launcher.transport.endpoint import (
    CommandResult,
    Endpoint,
    busy_error,
    deadline_error,
    idle_error,
    link_error,
    short,
)
from launcher.transport.runner import STATS

if TYPE_CHECKING:
    import paramiko
    import tenacity

    from launcher.transport.fabricview import OpenedConnection
    from launcher.transport.sshopen import Sock

# Attempts at connecting, all within one connect_timeout; the pause between them doubles.
CONNECT_ATTEMPTS = 3
RETRY_PAUSE = 0.2
MAX_RETRY_PAUSE = 2.0
POLL_SECONDS = 0.5  # how often a command's read loop checks its deadlines

# paramiko logs a traceback from its transport thread for every failed handshake (a port that
# is not SSH, a link cut by the deadline); the error raised here already says what happened.
# `--debug` adds a handler that shows them.
logging.getLogger("paramiko").addHandler(logging.NullHandler())
SESSION_REFUSED_RETRY = 2.0  # seconds a refused session is asked for again (_open_channel)


class SSHConnection:
    """One SSH connection to one host, opened on first use and closed by `close()`.

    Connecting (TCP, banner, key exchange, auth, and the tunnel through every jump host) ends
    within the host's connect_timeout as a whole, retries included. A connection that failed
    remembers why: if it was never established, every later use in this process fails at once
    with the same error; if it was established and then lost, each use may try again, but not
    sooner than connect_timeout after the last failed try. So a host that is unreachable costs
    a command at most one connect_timeout, however often the command asks for it.
    """

    def __init__(self, endpoint: Endpoint, *, jump: SSHConnection | None = None) -> None:
        self.endpoint = endpoint
        if jump is None and endpoint.via is not None:
            jump = SSHConnection(endpoint.via)
        self._jump = jump
        self._ssh_client: paramiko.SSHClient | None = None  # made on the first connect
        self._client: paramiko.SSHClient | None = None  # the same, set while connected
        self._fabric: OpenedConnection | None = None  # made when Fabric's API is asked for
        self._pkey: paramiko.PKey | None = None  # a key unlocked on the terminal
        self._prepared = False
        self._lock = threading.Lock()
        self._established = False
        self._failure: tuple[float, LauncherError] | None = None
        # One slot per session channel: a fleet of more containers than sshd's MaxSessions
        # waits for a slot instead of being refused ("administratively prohibited").
        self._sessions = threading.BoundedSemaphore(endpoint.max_sessions)
        self._persist_started = False
        self._closed = False  # for good: see close()

    # -- connecting -----------------------------------------------------------------------
    @property
    def fabric(self) -> OpenedConnection:
        """Fabric's Connection over this one, connected (for Fabric's own API: run, put, get,
        sftp); its gateway is the jump host's, or the ProxyCommand."""
        self._connected()
        if self._fabric is None:
            from launcher.transport.fabricview import OpenedConnection

            gateway = self._jump.fabric if self._jump else self.endpoint.proxy_command
            self._fabric = OpenedConnection(self.endpoint, self._connected, gateway)
        self._fabric.open()  # on this connection's client as it is now (after a reconnect too)
        return self._fabric

    def connect(self) -> None:
        """Connect now rather than on first use (the same errors as a first use would raise)."""
        self._connected()

    def _connected(self, deadline: float | None = None) -> paramiko.SSHClient:
        with self._lock:
            if self._closed:
                raise ConnectError(f"{self.endpoint.name}: the connection was closed")
            if self._client is not None and not _alive(self._client):
                # The link dropped (network blip, sshd restart): start over on the next use.
                self._client.close()
                self._client = None
            if self._client is None:
                self._raise_recent_failure()
                try:
                    if deadline is None:
                        self._prepare()  # may ask for a passphrase: before the clock starts
                    self._client = self._connect(deadline)
                except LauncherError as error:
                    self._failure = (time.monotonic(), error)
                    raise
                self._failure = None
                self._established = True
                self._start_persisting()
            return self._client

    def _start_persisting(self) -> None:
        """With control_persist: once, start the background process later commands use."""
        if self.endpoint.control_persist <= 0 or self._persist_started:
            return
        self._persist_started = True
        from launcher.transport import persist

        with contextlib.suppress(OSError):
            persist.start(self.endpoint)

    def _raise_recent_failure(self) -> None:
        if self._failure is None:
            return
        failed_at, error = self._failure
        if self._established and time.monotonic() - failed_at >= self.endpoint.connect_timeout:
            return
        # A new instance: the same one raised from several threads would share a traceback.
        raise type(error)(error.message, hint=error.hint)

    def _prepare(self) -> None:
        """Once, before the first connect of the chain: keys to unlock on the terminal."""
        if self._jump is not None:
            self._jump._prepare()
        if self._prepared:
            return
        if self.endpoint.passphrase == "prompt":
            from launcher.transport import sshkeys

            self._pkey = sshkeys.unlock(self.endpoint)
        self._prepared = True

    def _new_client(self) -> paramiko.SSHClient:
        """This host's paramiko client, made once (reconnects reuse it, as its host keys)."""
        if self._ssh_client is None:
            from launcher.transport import sshopen

            self._ssh_client = sshopen.new_client(self.endpoint)
        return self._ssh_client

    def _connect(self, deadline: float | None = None) -> paramiko.SSHClient:
        """Connect within the budget: attempts share one deadline, each gets what is left; the
        pause between them doubles, and no pause is taken that would end past the deadline."""
        import tenacity

        from launcher.transport import sshopen

        ep = self.endpoint
        if deadline is None:
            deadline = time.monotonic() + ep.connect_timeout
        client = self._new_client()

        def attempt() -> paramiko.SSHClient:
            assert deadline is not None
            return sshopen.open_once(client, ep, self._socket(deadline), deadline, self._pkey)

        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception_type(sshopen.RetryableConnect),
            stop=_stop_before(deadline, CONNECT_ATTEMPTS),
            wait=tenacity.wait_exponential(multiplier=RETRY_PAUSE, max=MAX_RETRY_PAUSE),
            reraise=True,  # the last attempt's own error, not tenacity's RetryError
        )
        try:
            client = retrying(attempt)
        except sshopen.RetryableConnect as failure:
            raise ConnectError(
                f"{ep.name}: cannot connect to {ep.user}@{ep.hostname}:{ep.port}: {failure}",
                hint=failure.hint
                or "check the address and port in the inventory, and that sshd is running",
            ) from None
        STATS.count("connects")
        return client

    def _socket(self, deadline: float) -> Sock:
        """What SSH runs over: a tunnel through the jump host, a ProxyCommand, or TCP."""
        from launcher.transport import sshopen

        if self._jump is not None:
            return self._jump.tunnel(self.endpoint, deadline)
        if self.endpoint.proxy_command:
            return sshopen.proxy_socket(self.endpoint)
        return sshopen.open_socket(self.endpoint, deadline)

    def tunnel(self, target: Endpoint, deadline: float) -> paramiko.Channel:
        """A direct-tcpip channel through this host (ProxyJump), within the caller's deadline."""
        from launcher.transport import sshopen

        transport = self._connected(deadline).get_transport()
        if transport is None:
            raise ConnectError(f"{self.endpoint.name}: jump host connection lost")
        channel: paramiko.Channel = sshopen.tunnel(transport, self.endpoint, target, deadline)
        return channel

    # -- commands -------------------------------------------------------------------------
    def open_command(self, command: str, timeout: float) -> paramiko.Channel:
        """A channel running `command`, its session slot held until close_command()."""
        return self._exec(command, timeout, timeout)

    def close_command(self, channel: paramiko.Channel) -> None:
        channel.close()
        self._sessions.release()

    def _open_channel(self) -> paramiko.Channel:
        """A new session channel on this host's one connection (opened on first use)."""
        from launcher.transport import sshopen

        ep = self.endpoint
        transport = self._connected().get_transport()
        if transport is None or not transport.is_active():
            raise ConnectError(f"{ep.name}: connection to {ep.hostname} was lost")
        # sshd counts a session it has closed against MaxSessions until its main loop collects
        # the channel, which can come after it has read our next open on the same connection:
        # a session refused just after one of ours closed is asked for again, for a moment. A
        # refused open ran nothing, so asking again cannot run a command twice.
        import tenacity  # loaded already: the connection was opened by _connect

        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception(lambda exc: sshopen.session_refused(exc, transport)),
            stop=_stop_before(time.monotonic() + SESSION_REFUSED_RETRY),
            wait=tenacity.wait_exponential(multiplier=0.02, max=0.25),
            reraise=True,  # the last refusal itself, not tenacity's RetryError
        )
        try:
            channel: paramiko.Channel = retrying(transport.open_session, timeout=ep.connect_timeout)
        except sshopen.CHANNEL_ERRORS as exc:
            raise ConnectError(f"{ep.name}: cannot open a session: {exc}") from None
        STATS.count("commands")
        return channel

    def _exec(self, command: str, wait: float | None, exec_timeout: float) -> paramiko.Channel:
        """A new channel with `command` started on it (its slot released if that fails)."""
        channel = self._take_session(command, wait)
        try:
            channel.settimeout(max(0.001, exec_timeout))
            channel.exec_command(command)
        except BaseException:
            channel.close()
            self._sessions.release()
            raise
        return channel

    def _take_session(self, command: str, wait: float | None) -> paramiko.Channel:
        """A session channel once one of the max_sessions slots is free (within `wait` s; None:
        no limit); the caller releases the slot when it closes the channel."""
        ep = self.endpoint
        if not self._sessions.acquire(timeout=wait):
            raise busy_error(ep, wait, command)
        try:
            return self._open_channel()
        except BaseException:
            self._sessions.release()
            raise

    @property
    def connected(self) -> bool:
        """Whether this process holds an open connection to the host (then its commands do
        not go through a persisted connection: this one is at hand)."""
        return self._client is not None

    def run(self, command: str, *, stdin: bytes | None, timeout: float) -> CommandResult:
        """`command` on a channel of its own, the whole exchange within `timeout` seconds."""
        from launcher.transport import sshopen

        ep = self.endpoint
        started = time.monotonic()
        deadline = started + timeout
        out, err = io.BytesIO(), io.BytesIO()
        channel: paramiko.Channel | None = None
        try:
            channel = self._exec(command, timeout, timeout)
            channel.settimeout(max(0.001, deadline - time.monotonic()))
            if stdin:
                channel.sendall(stdin)
            channel.shutdown_write()
            if _read_until_eof(channel, _sink(out), _sink(err), deadline=deadline) is not None:
                raise TimeoutError()
            if not channel.status_event.wait(max(0.0, deadline - time.monotonic())):
                raise TimeoutError()
            code = channel.recv_exit_status()
        except TimeoutError:
            raise deadline_error(ep, timeout, command) from None
        except sshopen.CHANNEL_ERRORS as exc:
            raise link_error(ep, exc) from None
        finally:
            if channel is not None:
                self.close_command(channel)
        duration = time.monotonic() - started
        return CommandResult(command, code, out.getvalue(), err.getvalue(), duration)

    def stream(
        self,
        command: str,
        on_stdout: Callable[[bytes], None],
        on_stderr: Callable[[bytes], None] | None = None,
        *,
        stdin: bytes | None = None,
        close_stdin: bool = True,
        timeout: float | None = None,
        idle_timeout: float | None = None,
        cancel: threading.Event | None = None,
    ) -> int:
        """Run a command and hand its output over as it arrives; returns its exit code.

        stdout and stderr are read together, so neither can fill up and block the other.
        `timeout` bounds the whole command (None: no limit), `idle_timeout` the silence on both
        streams. With `close_stdin=False` the remote side's stdin stays open until the channel
        closes, so it can notice the client going away. On any exception, KeyboardInterrupt
        included, the channel is closed at once (the remote command loses its pipes) and the
        exception propagates. `cancel` set: the same, and ConnectError (the persisted
        connection's client went away while the command was quiet).
        """
        from launcher.transport import sshopen

        ep = self.endpoint
        deadline = None if timeout is None else time.monotonic() + timeout
        channel: paramiko.Channel | None = None
        try:
            channel = self._exec(command, timeout, ep.connect_timeout)
            channel.settimeout(ep.connect_timeout)
            if stdin:
                channel.sendall(stdin)
            if close_stdin:
                channel.shutdown_write()
            expired = _read_until_eof(
                channel,
                on_stdout,
                on_stderr,
                deadline=deadline,
                idle_timeout=idle_timeout,
                cancel=cancel,
            )
            if expired == "cancel":
                raise link_error(ep, "the client went away")
            if expired == "deadline":
                raise deadline_error(ep, timeout, command)
            if expired == "idle":
                raise idle_error(ep, idle_timeout, command)
            if not channel.status_event.wait(ep.connect_timeout):
                raise CommandTimeout(f"{ep.name}: no exit status after EOF: {short(command)}")
            return channel.recv_exit_status()
        except _SinkFailed as failed:
            # Not the connection's fault (e.g. stdout's reader went away): the caller's error.
            raise failed.error from None
        except sshopen.CHANNEL_ERRORS as exc:
            raise link_error(ep, exc) from None
        finally:
            if channel is not None:
                self.close_command(channel)

    def close(self) -> None:
        """Close for good: a command a thread starts afterwards fails at once instead of
        connecting again (Ctrl-C on a fleet closes the connections under its threads)."""
        with self._lock:
            self._closed = True
            if self._fabric is not None:
                self._fabric.close()  # SFTP sessions Fabric opened, then the client
            if self._ssh_client is not None:
                self._ssh_client.close()  # also a client whose link had already dropped
            self._client = None
        if self._jump is not None:
            self._jump.close()

    def __enter__(self) -> SSHConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _stop_before(
    deadline: float, attempts: int | None = None
) -> Callable[[tenacity.RetryCallState], bool]:
    """tenacity's stop for attempts that share one deadline: after `attempts`, or before a pause
    that would end past the deadline (an attempt started then would have no time left)."""

    def stop(state: tenacity.RetryCallState) -> bool:
        last = attempts is not None and state.attempt_number >= attempts
        return last or time.monotonic() + state.upcoming_sleep >= deadline

    return stop


def _read_until_eof(
    channel: paramiko.Channel,
    on_stdout: Callable[[bytes], None],
    on_stderr: Callable[[bytes], None] | None,
    *,
    deadline: float | None,
    idle_timeout: float | None = None,
    cancel: threading.Event | None = None,
) -> Literal["deadline", "idle", "cancel"] | None:
    """The one read loop: stdout and stderr together until EOF, so neither can fill up and
    block the other. Returns None at EOF, or which limit ran out first."""
    last_data = time.monotonic()
    while True:
        now = time.monotonic()
        wait = POLL_SECONDS
        if deadline is not None:
            if now >= deadline:
                return "deadline"
            wait = min(wait, deadline - now)
        if idle_timeout is not None:
            if now - last_data >= idle_timeout:
                return "idle"
            wait = min(wait, last_data + idle_timeout - now)
        if cancel is not None and cancel.is_set():
            return "cancel"
        select.select([channel], [], [], wait)
        while channel.recv_ready():
            last_data = time.monotonic()
            _deliver(on_stdout, channel.recv(65536))
        while channel.recv_stderr_ready():
            last_data = time.monotonic()
            data = channel.recv_stderr(65536)
            if on_stderr is not None:
                _deliver(on_stderr, data)
        # Done at EOF or close, but only once both buffers are empty: data can arrive on one
        # stream while the other is being read, just before the close.
        finished = channel.eof_received or channel.closed
        if finished and not channel.recv_ready() and not channel.recv_stderr_ready():
            return None


class _SinkFailed(Exception):
    """An exception from a caller's output callback, carried past the SSH error handling."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


def _deliver(sink: Callable[[bytes], None], data: bytes) -> None:
    try:
        sink(data)
    except Exception as exc:
        raise _SinkFailed(exc) from exc


def _sink(buffer: io.BytesIO) -> Callable[[bytes], None]:
    def write(data: bytes) -> None:
        buffer.write(data)

    return write


def _alive(client: paramiko.SSHClient) -> bool:
    transport = client.get_transport()
    return transport is not None and transport.is_active()
