"""Opening one SSH connection with paramiko's client, within a deadline (imported only to connect).

The client carries launcher's host-key policy and the known hosts file; launcher opens the
socket under it (TCP, a tunnel through the jump host's transport, or the ProxyCommand) so that
one deadline bounds every phase: each paramiko timeout gets what is left, and a watchdog closes
the attempt when the deadline passes. Fabric is not imported to connect: its API is built over
the connected client when asked for (fabricview.py).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import subprocess
import threading
import time
from typing import TYPE_CHECKING, Any

from launcher.core.errors import AuthError, ConfigError, HostKeyError
from launcher.transport import sshkeys
from launcher.transport.sshlibs import paramiko

if TYPE_CHECKING:
    from launcher.transport.endpoint import Endpoint

KEEPALIVE_SECONDS = 15
# What a command may raise from the channel once connected.
CHANNEL_ERRORS = (paramiko.SSHException, OSError, EOFError)
# sshd's answers to a session it will not open now: MaxSessions reached ("connect failed" from
# session_new, "administratively prohibited" from other refusals).
SESSION_REFUSED = (
    paramiko.common.OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED,
    paramiko.common.OPEN_FAILED_CONNECT_FAILED,
)


def session_refused(exc: BaseException, transport: Any) -> bool:
    """Whether a failed session open is sshd refusing it for now (nothing ran). paramiko keeps
    one saved failure per connection: of two opens refused at once, one gets the refusal and
    the other only "Unable to open channel." (the link itself is then still up)."""
    if isinstance(exc, paramiko.ChannelException):
        return exc.code in SESSION_REFUSED
    unexplained = isinstance(exc, paramiko.SSHException) and str(exc) == "Unable to open channel."
    return unexplained and bool(transport.is_active())


STDERR_KEPT = 4096
STDERR_DRAIN_SECONDS = 0.5  # for an ended ProxyCommand's stderr to reach the message
# What paramiko says when it had no key or agent to offer.
NO_KEYS = "No authentication methods available"


class RetryableConnect(Exception):
    """An attempt that failed in a way a new attempt may not (refused, reset, timed out)."""

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint


class HostKeyPolicy(paramiko.MissingHostKeyPolicy):
    """Reject unknown keys with advice; with accept-new, record them (changed keys never pass)."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint

    def missing_host_key(
        self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey
    ) -> None:
        ep = self.endpoint
        if ep.accept_new:
            ep.known_hosts.parent.mkdir(parents=True, exist_ok=True)
            with ep.known_hosts.open("a", encoding="utf-8") as handle:
                handle.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")
            # Known from now on, also to a reconnect of this client.
            client.get_host_keys().add(hostname, key.get_name(), key)
            return
        raise HostKeyError(
            f"{ep.name}: host key of {hostname} is not in {ep.known_hosts} "
            f"({key.get_name()} {key.fingerprint})",
            hint=(
                f"verify the fingerprint, then: ssh-keyscan -p {ep.port} {ep.hostname} >> "
                f"{ep.known_hosts}   (or set host_key_policy: accept-new for this host)"
            ),
        )


def new_client(ep: Endpoint) -> paramiko.SSHClient:
    """paramiko's client for an endpoint: launcher's host-key policy and known hosts.

    ssh_config was already read the OpenSSH way (launcher.sshconfig): the inventory and
    ssh_config are the only sources of what the connection uses."""
    sshkeys.check_identity_files(ep)
    client = paramiko.SSHClient()
    client.set_missing_host_key_policy(HostKeyPolicy(ep))
    if ep.known_hosts.is_file():
        try:
            client.get_host_keys().load(str(ep.known_hosts))
        except (OSError, UnicodeDecodeError, paramiko.hostkeys.InvalidHostKey) as exc:
            line = exc.line.strip() if isinstance(exc, paramiko.hostkeys.InvalidHostKey) else exc
            raise ConfigError(
                [f"{ep.known_hosts}: cannot read the known host keys: {line}"],
                hint="each line is: host[,host...] key-type base64-key (ssh-keyscan writes them)",
            ) from None
    return client


def open_once(
    client: paramiko.SSHClient,
    ep: Endpoint,
    sock: Sock,
    deadline: float,
    pkey: paramiko.PKey | None,
) -> paramiko.SSHClient:
    """One attempt: SSH over `sock` with `client`, all of it before `deadline`."""
    try:
        left = time_left(ep, deadline)
    except RetryableConnect:
        sock.close()
        raise
    kwargs: dict[str, Any] = {
        "hostname": ep.hostname,  # names the host's key in known_hosts ([host]:port)
        "port": ep.port,
        "username": ep.user,
        "sock": sock,
        "look_for_keys": not ep.identity_files,
        "allow_agent": True,
        "pkey": pkey,
        # paramiko bounds each phase on its own; the watchdog bounds them together.
        "timeout": left,
        "banner_timeout": left,
        "auth_timeout": left,
        "channel_timeout": left,
    }
    if ep.identity_files:
        kwargs["key_filename"] = list(ep.identity_files)  # paramiko takes a list here too
    watchdog = _Watchdog(client, sock, left)
    try:
        client.connect(**kwargs)
        if not watchdog.finish():
            raise RetryableConnect("timed out")  # the watchdog closed it just now
    except HostKeyError:
        watchdog.finish()
        client.close()
        raise
    except paramiko.BadHostKeyException as exc:
        watchdog.finish()
        client.close()
        raise HostKeyError(
            f"{ep.name}: host key of {ep.hostname} CHANGED (known_hosts: {ep.known_hosts}); "
            f"got {exc.key.get_name()} {exc.key.fingerprint}",
            hint=(
                "if the host was reinstalled, remove the old key with "
                f"ssh-keygen -R '{ep.known_hosts_key}' -f {ep.known_hosts} and add the new one"
            ),
        ) from None
    except Exception as exc:
        timed_out = not watchdog.finish()
        phase = _handshake_phase(client)
        # Asked before closing: closing ends the ProxyCommand too.
        proxy_ended = (
            isinstance(sock, CommandSocket)
            and not timed_out
            and not isinstance(exc, paramiko.AuthenticationException)
            and sock.ended_by_itself()
        )
        client.close()
        sock.close()
        if proxy_ended:
            assert isinstance(sock, CommandSocket)
            raise RetryableConnect(
                f"the ProxyCommand ended ({sock.describe()})",
                hint=f"run it by hand to see why: {ep.proxy_command}",
            ) from None
        raise _failure(ep, exc, timed_out=timed_out, phase=phase) from None
    transport = client.get_transport()
    if transport is not None:
        transport.set_keepalive(KEEPALIVE_SECONDS)
    return client


def _failure(ep: Endpoint, exc: Exception, *, timed_out: bool, phase: str) -> Exception:
    """What a failed attempt becomes: retryable, or an error that says what to do."""
    if timed_out or isinstance(exc, TimeoutError):
        return timed_out_error(ep, phase)
    if isinstance(exc, paramiko.AuthenticationException):
        message = f"{ep.name}: authentication as {ep.user}@{ep.hostname} failed: {exc}"
        hint = "check identity_file, ssh-agent and the host's authorized_keys"
        locked = sshkeys.locked_keys(ep)
        if locked:
            why, hint = sshkeys.locked_hint(ep, locked)
            message = f"{ep.name}: authentication as {ep.user}@{ep.hostname} failed: {why}"
        return AuthError(message, hint=hint)
    if isinstance(exc, paramiko.SSHException) and str(exc) == NO_KEYS:
        return AuthError(
            f"{ep.name}: no key to authenticate as {ep.user}@{ep.hostname} with",
            hint="set identity_file in the inventory (or IdentityFile in ssh_config for this "
            "host), or load a key into ssh-agent",
        )
    if isinstance(exc, OSError) and exc.filename and str(exc.filename) in ep.identity_files:
        # paramiko lets the OSError of an identity file it cannot open out of connect();
        # retried, it would end as "cannot reach" and point at the network.
        why = "not found" if isinstance(exc, FileNotFoundError) else exc.strerror or str(exc)
        return AuthError(
            f"{ep.name}: identity file {exc.filename}: {why}",
            hint="fix identity_file in the inventory (or IdentityFile in ssh_config), name the "
            "key with --identity FILE, or load it into ssh-agent (a missing identity_file then "
            "falls back to the agent); `launcher inventory check` checks every host's key files",
        )
    if isinstance(exc, OSError | EOFError | paramiko.SSHException):
        return RetryableConnect(str(exc) or type(exc).__name__)
    return exc


def tunnel(transport: paramiko.Transport, ep: Endpoint, target: Endpoint, deadline: float) -> Any:
    """A direct-tcpip channel through `ep`'s transport to `target` (ProxyJump)."""
    try:
        return transport.open_channel(
            "direct-tcpip",
            (target.hostname, target.port),
            ("", 0),
            timeout=time_left(target, deadline),
        )
    except (paramiko.SSHException, OSError) as exc:
        raise RetryableConnect(f"via {ep.hostname}: {exc}") from None


def open_socket(ep: Endpoint, deadline: float) -> socket.socket:
    """TCP to the host, with Nagle's algorithm off and its ACKs sent at once (QuickAckSocket).

    paramiko sets no socket options and writes each SSH packet in one send(), so a small packet
    sent while the last is unacknowledged (key exchange, every channel open after the first)
    waits for the peer's delayed ACK, 40 ms on Linux. asyncssh turns Nagle off for the same
    reason (ronf/asyncssh#50). Measured on the sandbox: connect 62 -> 19 ms, a channel open
    on a connection in use 43 -> 0.4 ms."""
    try:
        sock = socket.create_connection((ep.hostname, ep.port), timeout=time_left(ep, deadline))
    except TimeoutError:
        raise timed_out_error(ep, "tcp") from None
    except OSError as exc:
        raise RetryableConnect(str(exc) or type(exc).__name__, hint=socket_hint(ep, exc)) from None
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if QUICKACK is None:
        return sock
    timeout = sock.gettimeout()
    quick = QuickAckSocket(sock.family, sock.type, sock.proto, fileno=sock.detach())
    quick.settimeout(timeout)
    return quick


QUICKACK: int | None = getattr(socket, "TCP_QUICKACK", None)  # Linux only


class QuickAckSocket(socket.socket):
    """A TCP socket that acknowledges what it reads at once (TCP_QUICKACK before each read).

    The host's sshd leaves Nagle's algorithm on for a session without a terminal (OpenSSH sets
    TCP_NODELAY only in ssh_packet_set_interactive). After the login it sends a message of its
    own (hostkeys-00@openssh.com), so its reply to the first channel open waits for our ACK of
    that message, which Linux delays by 40 ms: the first command of every new connection paid
    it. Linux does not keep the option set (tcp(7): "not permanent"), so each read sets it
    again. Measured on the sandbox: the first channel open 43 -> 1 ms (median of 9)."""

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        if QUICKACK is not None:
            with contextlib.suppress(OSError):  # closed meanwhile: the read says so
                self.setsockopt(socket.IPPROTO_TCP, QUICKACK, 1)
        return super().recv(bufsize, flags)


def socket_hint(ep: Endpoint, exc: OSError) -> str | None:
    """The cause a failed TCP connect names: a refused port, or a name that does not resolve."""
    where = f"{ep.hostname}:{ep.port}"
    if isinstance(exc, ConnectionRefusedError):
        return (
            f"nothing listens on {where}: check the port in the inventory (or ssh_config) "
            "and that sshd runs there"
        )
    if isinstance(exc, socket.gaierror):
        return f"the name {ep.hostname} does not resolve: check the address in the inventory"
    return None


def time_left(ep: Endpoint, deadline: float) -> float:
    """Seconds left of the connect budget (an attempt that has none left fails)."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise RetryableConnect(f"connect_timeout ({ep.connect_timeout:g} s) used up")
    return left


class CommandSocket:
    """A ProxyCommand as the socket under SSH: the command's stdin and stdout.

    Run by /bin/sh as OpenSSH runs it (`exec COMMAND`). Unlike paramiko's ProxyCommand, its
    end is an end of file (a failed proxy fails the attempt at once, not at the deadline), and
    what it printed on stderr is kept for the error message."""

    def __init__(self, command: str) -> None:
        self.command = command
        self.process = subprocess.Popen(
            ["/bin/sh", "-c", "exec " + command],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            bufsize=0,
        )
        self.timeout: float | None = None
        self._stderr = bytearray()
        self._reader = threading.Thread(target=self._read_stderr, daemon=True)
        self._reader.start()

    def _read_stderr(self) -> None:
        assert self.process.stderr is not None
        for chunk in iter(lambda: self.process.stderr.read(1024), b""):  # type: ignore[union-attr]
            self._stderr += chunk
            del self._stderr[:-STDERR_KEPT]

    def settimeout(self, timeout: float | None) -> None:
        self.timeout = timeout

    def send(self, data: bytes) -> int:
        assert self.process.stdin is not None
        try:
            return os.write(self.process.stdin.fileno(), data)
        except (BrokenPipeError, ValueError) as exc:
            raise EOFError(f"the ProxyCommand ended ({self.describe()})") from exc

    def recv(self, size: int) -> bytes:
        """Up to `size` bytes; b"" at the end (also once closed); TimeoutError after `timeout`."""
        assert self.process.stdout is not None
        try:
            ready, _, _ = select.select([self.process.stdout], [], [], self.timeout)
            if not ready:
                raise TimeoutError()
            return os.read(self.process.stdout.fileno(), size)
        except (ValueError, OSError) as exc:
            if isinstance(exc, TimeoutError):
                raise
            return b""  # closed under the reader (the watchdog, or close())

    def ended_by_itself(self) -> bool:
        """Whether the command exited (given a moment: its end of file comes first)."""
        try:
            self.process.wait(0.2)
        except subprocess.TimeoutExpired:
            return False
        return True

    def describe(self) -> str:
        code = self.process.poll()
        if code is not None:
            # Its last words may still be in the pipe, not yet read by the reader thread (seen
            # on a busy machine): wait for the pipe's end, bounded (a child of the command's
            # may hold the pipe open).
            self._reader.join(STDERR_DRAIN_SECONDS)
        said = self._stderr.decode("utf-8", "replace").strip().splitlines()
        status = "still running" if code is None else f"exit code {code}"
        return f"{status}: {said[-1]}" if said else status

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(1)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        for pipe in (self.process.stdin, self.process.stdout):
            if pipe is not None:
                pipe.close()

    @property
    def closed(self) -> bool:
        return self.process.poll() is not None

    @property
    def _closed(self) -> bool:  # what paramiko's Transport asks of its socket
        return self.closed


Sock = socket.socket | paramiko.Channel | CommandSocket


def proxy_socket(ep: Endpoint) -> CommandSocket:
    assert ep.proxy_command is not None
    try:
        return CommandSocket(ep.proxy_command)
    except OSError as exc:
        raise RetryableConnect(f"cannot run the ProxyCommand: {exc}") from None


class _Watchdog:
    """Closes a connection attempt that is still going at its deadline (from a timer thread)."""

    def __init__(self, client: paramiko.SSHClient, sock: Sock, seconds: float) -> None:
        self._client = client
        self._sock = sock
        self._lock = threading.Lock()
        self._state = "running"
        self._timer = threading.Timer(seconds, self._fire)
        self._timer.daemon = True
        self._timer.start()

    def _fire(self) -> None:
        with self._lock:
            if self._state != "running":
                return
            self._state = "fired"
        # Closing the transport makes every phase of paramiko's connect fail at once.
        transport = self._client.get_transport()
        if transport is not None:
            transport.close()
        self._sock.close()

    def finish(self) -> bool:
        """Stop watching; False when the deadline had already closed the attempt."""
        self._timer.cancel()
        with self._lock:
            if self._state == "running":
                self._state = "finished"
            return self._state == "finished"


def _handshake_phase(client: paramiko.SSHClient) -> str:
    """How far an SSH handshake got: banner, kex (key exchange) or auth."""
    transport = client.get_transport()
    if transport is None or not transport.remote_version:
        return "banner"
    return "kex" if transport.session_id is None else "auth"


def timed_out_error(ep: Endpoint, phase: str) -> RetryableConnect:
    budget = f"within connect_timeout ({ep.connect_timeout:g} s)"
    where = f"{ep.hostname}:{ep.port}"
    if phase == "tcp":
        return RetryableConnect(
            f"no TCP connection {budget}",
            hint=f"check the address and port, and that nothing drops packets to {where}",
        )
    if phase == "banner" and ep.proxy_command:
        return RetryableConnect(
            f"no SSH banner through the ProxyCommand {budget}",
            hint=f"run it by hand to see what it does: {ep.proxy_command}",
        )
    if phase == "banner":
        return RetryableConnect(
            f"the port accepted the connection but sent no SSH banner {budget}",
            hint=f"{where} may not be an SSH server (check the port in the inventory), "
            "or sshd there is overloaded",
        )
    what = "the SSH key exchange" if phase == "kex" else "authentication"
    return RetryableConnect(
        f"{what} did not finish {budget}",
        hint=f"sshd on {where} answers but stalls; raise connect_timeout for a slow link",
    )
