"""The SSH layer: the only module that imports paramiko.

One `Connection` per host, opened lazily and shared by everything that acts on that host's
containers. Host keys are always checked; connect, banner, auth and every command are bounded;
only the connect phase is retried.
"""

from __future__ import annotations

import io
import os
import select
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import paramiko
from tenacity import (
    retry,
    retry_if_exception_type,
    stop_after_attempt,
    stop_after_delay,
    wait_exponential,
)

from launcher.config import HostSpec
from launcher.errors import AuthError, CommandTimeout, ConnectError, HostKeyError

KEEPALIVE_SECONDS = 15
CONNECT_ATTEMPTS = 3


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


@dataclass
class ConnectionStats:
    connects: int = 0
    commands: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def count(self, what: str) -> None:
        with self.lock:
            setattr(self, what, getattr(self, what) + 1)


STATS = ConnectionStats()


@dataclass(frozen=True)
class Endpoint:
    """Where and how to connect, after merging the inventory with ~/.ssh/config."""

    name: str
    hostname: str
    port: int
    user: str
    identity_files: tuple[str, ...]
    known_hosts: Path
    accept_new: bool
    jump: str | None
    connect_timeout: float
    command_timeout: float

    @property
    def known_hosts_key(self) -> str:
        return self.hostname if self.port == 22 else f"[{self.hostname}]:{self.port}"


def resolve_endpoint(name: str, host: HostSpec, ssh_config: Path | None = None) -> Endpoint:
    """Inventory values win; ~/.ssh/config fills what the inventory left unset."""
    config_path = ssh_config or Path("~/.ssh/config").expanduser()
    looked: dict[str, Any] = {}
    if config_path.is_file():
        looked = dict(paramiko.SSHConfig.from_path(str(config_path)).lookup(host.address))
    explicit = host.model_fields_set
    known_hosts = (
        host.known_hosts or _first(looked.get("userknownhostsfile")) or "~/.ssh/known_hosts"
    )
    identities = (
        [host.identity_file] if host.identity_file else list(looked.get("identityfile", []))
    )
    return Endpoint(
        name=name,
        hostname=str(looked.get("hostname", host.address)),
        port=host.port if "port" in explicit else int(looked.get("port", host.port)),
        user=host.user if "user" in explicit else str(looked.get("user", host.user)),
        identity_files=tuple(os.path.expanduser(p) for p in identities),
        known_hosts=Path(os.path.expanduser(known_hosts)),
        accept_new=host.host_key_policy == "accept-new",
        jump=host.jump or looked.get("proxyjump"),
        connect_timeout=host.connect_timeout,
        command_timeout=host.command_timeout,
    )


def _first(value: Any) -> str | None:
    if isinstance(value, list):
        return str(value[0]).split()[0] if value else None
    return str(value) if value else None


class _HostKeyPolicy(paramiko.MissingHostKeyPolicy):
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
            return
        raise HostKeyError(
            f"{ep.name}: host key of {hostname} is not in {ep.known_hosts} "
            f"({key.get_name()} {key.fingerprint})",
            hint=(
                f"verify the fingerprint, then: ssh-keyscan -p {ep.port} {ep.hostname} >> "
                f"{ep.known_hosts}   (or set host_key_policy: accept-new for this host)"
            ),
        )


class _RetryableConnect(Exception):
    pass


class Connection:
    """One SSH connection to one host, opened on first use and closed by `close()`."""

    def __init__(self, endpoint: Endpoint, *, jump: Connection | None = None) -> None:
        self.endpoint = endpoint
        self._jump = jump
        self._client: paramiko.SSHClient | None = None
        self._lock = threading.Lock()

    # -- connecting -----------------------------------------------------------------------
    def _connected(self) -> paramiko.SSHClient:
        with self._lock:
            if self._client is not None and not _alive(self._client):
                # The link dropped (network blip, sshd restart): start over on the next use.
                self._client.close()
                self._client = None
            if self._client is None:
                self._client = self._connect()
            return self._client

    def _connect(self) -> paramiko.SSHClient:
        ep = self.endpoint
        attempt = retry(
            retry=retry_if_exception_type(_RetryableConnect),
            stop=stop_after_attempt(CONNECT_ATTEMPTS) | stop_after_delay(ep.connect_timeout * 3),
            wait=wait_exponential(multiplier=0.2, max=2.0),
            reraise=True,
        )(self._connect_once)
        try:
            return attempt()
        except _RetryableConnect as exc:
            raise ConnectError(
                f"{ep.name}: cannot connect to {ep.user}@{ep.hostname}:{ep.port}: {exc}",
                hint="check the address and port in the inventory, and that sshd is running",
            ) from None

    def _connect_once(self) -> paramiko.SSHClient:
        ep = self.endpoint
        client = paramiko.SSHClient()
        if ep.known_hosts.is_file():
            client.get_host_keys().load(str(ep.known_hosts))
        client.set_missing_host_key_policy(_HostKeyPolicy(ep))
        sock = self._jump.tunnel(ep.hostname, ep.port, ep.connect_timeout) if self._jump else None
        try:
            client.connect(
                ep.hostname,
                port=ep.port,
                username=ep.user,
                # paramiko takes a list here too (its stubs say str only).
                key_filename=list(ep.identity_files) or None,  # type: ignore[arg-type]
                look_for_keys=not ep.identity_files,
                allow_agent=True,
                timeout=ep.connect_timeout,
                banner_timeout=ep.connect_timeout,
                auth_timeout=ep.connect_timeout,
                channel_timeout=ep.connect_timeout,
                sock=sock,
            )
        except HostKeyError:
            client.close()
            raise
        except paramiko.BadHostKeyException as exc:
            client.close()
            raise HostKeyError(
                f"{ep.name}: host key of {ep.hostname} CHANGED (known_hosts: {ep.known_hosts}); "
                f"got {exc.key.get_name()} {exc.key.fingerprint}",
                hint=(
                    "if the host was reinstalled, remove the old key with "
                    f"ssh-keygen -R '{ep.known_hosts_key}' -f {ep.known_hosts} and add the new one"
                ),
            ) from None
        except paramiko.AuthenticationException as exc:
            client.close()
            raise AuthError(
                f"{ep.name}: authentication as {ep.user}@{ep.hostname} failed: {exc}",
                hint="check identity_file, ssh-agent and the host's authorized_keys",
            ) from None
        except (OSError, EOFError, paramiko.SSHException) as exc:
            client.close()
            raise _RetryableConnect(str(exc) or type(exc).__name__) from None
        transport = client.get_transport()
        if transport is not None:
            transport.set_keepalive(KEEPALIVE_SECONDS)
        STATS.count("connects")
        return client

    def tunnel(self, hostname: str, port: int, timeout: float) -> paramiko.Channel:
        """A direct-tcpip channel through this host (ProxyJump)."""
        transport = self._connected().get_transport()
        if transport is None:
            raise ConnectError(f"{self.endpoint.name}: jump host connection lost")
        try:
            return transport.open_channel(
                "direct-tcpip", (hostname, port), ("127.0.0.1", 0), timeout=timeout
            )
        except (paramiko.SSHException, OSError) as exc:
            raise _RetryableConnect(f"via {self.endpoint.hostname}: {exc}") from None

    # -- commands -------------------------------------------------------------------------
    def _open_channel(self) -> paramiko.Channel:
        """A new session channel on this host's one connection (opened on first use)."""
        ep = self.endpoint
        transport = self._connected().get_transport()
        if transport is None or not transport.is_active():
            raise ConnectError(f"{ep.name}: connection to {ep.hostname} was lost")
        try:
            channel = transport.open_session(timeout=ep.connect_timeout)
        except (paramiko.SSHException, OSError) as exc:
            raise ConnectError(f"{ep.name}: cannot open a session: {exc}") from None
        STATS.count("commands")
        return channel

    def run(
        self, command: str, *, stdin: bytes | None = None, timeout: float | None = None
    ) -> CommandResult:
        """Run a shell command string on the host, with a deadline on the whole exchange."""
        ep = self.endpoint
        limit = timeout if timeout is not None else ep.command_timeout
        started = time.monotonic()
        deadline = started + limit
        channel = self._open_channel()
        try:
            channel.settimeout(limit)
            channel.exec_command(command)
            if stdin:
                channel.sendall(stdin)
            channel.shutdown_write()
            stdout, stderr = _drain(channel, deadline)
            if not channel.status_event.wait(max(0.0, deadline - time.monotonic())):
                raise TimeoutError()
            code = channel.recv_exit_status()
        except TimeoutError:
            raise CommandTimeout(
                f"{ep.name}: command did not finish within {limit:g} s: {_short(command)}"
            ) from None
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise ConnectError(f"{ep.name}: connection failed during a command: {exc}") from None
        finally:
            channel.close()
        return CommandResult(command, code, stdout, stderr, time.monotonic() - started)

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

        stdout and stderr are read together, so neither can fill up and block the other.
        `timeout` bounds the whole command (None: no limit), `idle_timeout` the silence on both
        streams. With `close_stdin=False` the remote side's stdin stays open until the channel
        closes, so it can notice the client going away. On any exception, KeyboardInterrupt
        included, the channel is closed at once (the remote command loses its pipes) and the
        exception propagates.
        """
        ep = self.endpoint
        started = time.monotonic()
        deadline = None if timeout is None else started + timeout
        channel = self._open_channel()
        last_data = started
        try:
            channel.settimeout(ep.connect_timeout)
            channel.exec_command(command)
            if stdin:
                channel.sendall(stdin)
            if close_stdin:
                channel.shutdown_write()
            while True:
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    raise CommandTimeout(
                        f"{ep.name}: command did not finish within {timeout:g} s: {_short(command)}"
                    )
                if idle_timeout is not None and now - last_data >= idle_timeout:
                    raise CommandTimeout(
                        f"{ep.name}: no output for {idle_timeout:g} s: {_short(command)}"
                    )
                select.select([channel], [], [], 0.5)
                while channel.recv_ready():
                    last_data = time.monotonic()
                    on_stdout(channel.recv(65536))
                while channel.recv_stderr_ready():
                    last_data = time.monotonic()
                    data = channel.recv_stderr(65536)
                    if on_stderr is not None:
                        on_stderr(data)
                pending = channel.recv_ready() or channel.recv_stderr_ready()
                if (channel.eof_received or channel.closed) and not pending:
                    break
            if not channel.status_event.wait(ep.connect_timeout):
                raise CommandTimeout(f"{ep.name}: no exit status after EOF: {_short(command)}")
            return channel.recv_exit_status()
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise ConnectError(f"{ep.name}: connection failed during a command: {exc}") from None
        finally:
            channel.close()

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None
        if self._jump is not None:
            self._jump.close()

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _alive(client: paramiko.SSHClient) -> bool:
    transport = client.get_transport()
    return transport is not None and transport.is_active()


def _drain(channel: paramiko.Channel, deadline: float) -> tuple[bytes, bytes]:
    """Read stdout and stderr together until EOF, so neither can fill up and block the other."""
    out = io.BytesIO()
    err = io.BytesIO()
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError()
        select.select([channel], [], [], min(remaining, 1.0))
        while channel.recv_ready():
            out.write(channel.recv(65536))
        while channel.recv_stderr_ready():
            err.write(channel.recv_stderr(65536))
        # Done at EOF or close, but only once both buffers are empty: data can arrive on one
        # stream while the other is being read, just before the close.
        finished = channel.eof_received or channel.closed
        if finished and not channel.recv_ready() and not channel.recv_stderr_ready():
            return out.getvalue(), err.getvalue()


def _short(command: str, limit: int = 120) -> str:
    return command if len(command) <= limit else command[: limit - 3] + "..."


def _parse_jump(jump: str) -> tuple[str | None, str, int]:
    user, _, rest = jump.rpartition("@")
    host, _, port = rest.partition(":")
    return (user or None), host, int(port or 22)


class ConnectionPool:
    """One lazily opened connection per host, shared by every target on that host."""

    def __init__(self, ssh_config: Path | None = None) -> None:
        self._ssh_config = ssh_config
        self._connections: dict[str, Connection] = {}
        self._lock = threading.Lock()

    def get(self, name: str, host: HostSpec) -> Connection:
        with self._lock:
            conn = self._connections.get(name)
            if conn is None:
                endpoint = resolve_endpoint(name, host, self._ssh_config)
                jump = None
                if endpoint.jump:
                    user, jump_host, jump_port = _parse_jump(endpoint.jump)
                    jump_spec = host.model_copy(
                        update={
                            "address": jump_host,
                            "port": jump_port,
                            "user": user or endpoint.user,
                            "jump": None,
                        }
                    )
                    jump = Connection(
                        resolve_endpoint(f"{name} (jump)", jump_spec, self._ssh_config)
                    )
                conn = Connection(endpoint, jump=jump)
                self._connections[name] = conn
            return conn

    def close(self) -> None:
        with self._lock:
            for conn in self._connections.values():
                conn.close()
            self._connections.clear()

    def __enter__(self) -> ConnectionPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
