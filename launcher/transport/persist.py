"""Persisted connections: a host's SSH connection kept open between commands.

With `control_persist: SECONDS` on a host, the first command that connects to it also starts a
small background process (`python -m launcher.transport.persistserver`) that opens a
connection of its own and runs later commands' remote commands over a Unix socket, until
nothing used it for SECONDS.
A later `launcher status` then skips importing the SSH libraries and the SSH handshake, as
OpenSSH's ControlPersist lets a later `ssh` skip them.

Why this is safe to trust:
- The socket is in a directory of the user's own ($XDG_RUNTIME_DIR/launcher, else
  /tmp/launcher-<uid>): a real directory, owned by the user, mode 0700, checked before every
  use (anything else and nothing is persisted); the socket is 0600. Both ends check the other's
  uid (SO_PEERCRED): another user's process can neither serve nor use a persisted connection.
- The socket's name is a hash of everything that decides where and how to connect (the
  resolved endpoint: address, port, user, keys, known_hosts, jump chain, ProxyCommand, limits),
  so a changed inventory or ssh_config gets a connection of its own.
- The background process connects through the same code as any command: host keys are checked
  the same way. A key that needs a passphrase typed on the terminal cannot be used by it (it
  has no terminal): such a host is never persisted.
- Every command travels this way, streamed ones too (a deploy's transaction, `logs -f`): the
  frames are frames.py's, as the relay's. A client that goes away (Ctrl-C, a closed pipe)
  closes its socket, and the background process closes that command's channel at once, as a
  dropped direct connection would.
- A socket that does not answer (its process was killed) only means the command connects by
  itself and starts a new background process; an answer that breaks off mid-command is a
  connection error, as when a direct connection drops: the command is not run a second time.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from launcher.core.errors import (
    AuthError,
    CommandTimeout,
    ConnectError,
    HostKeyError,
    LauncherError,
    RemoteError,
)
from launcher.transport import frames
from launcher.transport.rundir import connect_own, runtime_dir
from launcher.transport.runner import STATS, Sink, Unavailable, run_by_streaming

if TYPE_CHECKING:
    from launcher.transport.endpoint import CommandResult, Endpoint

ANSWER_MARGIN = 10.0  # seconds past the command's own deadline before the answer is given up
ACK_TIMEOUT = 5.0  # for the server's Taken
NO_TIMEOUT = 7 * 86400.0  # a stream without a deadline (bounded by its idle timeout instead)
ERRORS: dict[str, type[LauncherError]] = {
    cls.__name__: cls for cls in (CommandTimeout, ConnectError, HostKeyError, AuthError)
}


# -- where -------------------------------------------------------------------------------------


def endpoint_doc(endpoint: Endpoint) -> dict[str, Any]:
    """The endpoint as JSON (the jump chain included), what the background process gets."""
    doc = dataclasses.asdict(endpoint)

    def paths(d: dict[str, Any]) -> None:
        d["known_hosts"] = str(d["known_hosts"])
        d["identity_files"] = list(d["identity_files"])
        if d.get("via"):
            paths(d["via"])

    paths(doc)
    return doc


def endpoint_from_doc(doc: dict[str, Any]) -> Endpoint:
    from launcher.transport.endpoint import Endpoint

    via = endpoint_from_doc(doc["via"]) if doc.get("via") else None
    fields = {**doc, "via": via, "known_hosts": Path(doc["known_hosts"])}
    fields["identity_files"] = tuple(doc["identity_files"])
    return Endpoint(**fields)


def socket_path(endpoint: Endpoint) -> Path | None:
    directory = runtime_dir()
    if directory is None:
        return None
    # The frame format's version too: a client never talks to a server of another release.
    doc = {"frames": frames.VERSION, **endpoint_doc(endpoint)}
    key = json.dumps(doc, sort_keys=True).encode()
    return directory / f"{hashlib.sha256(key).hexdigest()[:32]}.sock"


def unattended(endpoint: Endpoint) -> bool:
    """A host that can be connected to with nobody at the terminal: none of its hops needs a
    passphrase typed there."""
    hop: Endpoint | None = endpoint
    while hop is not None:
        if hop.passphrase == "prompt":
            return False
        hop = hop.via
    return True


def persistable(endpoint: Endpoint) -> bool:
    """A host whose connection a background process can open (and is asked to keep)."""
    return unattended(endpoint) and endpoint.control_persist > 0


# -- the client side ---------------------------------------------------------------------------


def _connect(path: Path) -> socket.socket | None:
    """A connection to a live background process of this user's at `path`, or None."""
    return connect_own(path, socket.SOCK_STREAM, 2.0)


def failure_frame(rid: int, error: LauncherError) -> frames.Failed:
    """A command's failure as the background process hands it over."""
    return frames.Failed(rid, type(error).__name__, error.message, error.hint)


def raise_failure(frame: frames.Failed) -> NoReturn:
    """The failure the background process handed over, raised as the same kind of error."""
    raise ERRORS.get(frame.kind, RemoteError)(frame.message, hint=frame.hint)


class PersistedRunner:
    """The runner over a host's persisted connection: one Unix-socket connection a command,
    frames.py's frames on it. Unavailable when no background process takes the command (it
    then did not run: the server sends Taken before it runs one, and runs none whose Taken it
    could not deliver)."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        # The sockets of the commands under way (other threads' too): close() shuts them down,
        # so a command waiting for output ends now (Ctrl-C on a fleet or a job's `logs -f`).
        self._live: set[socket.socket] = set()
        self._live_lock = threading.Lock()
        self._closed = False

    def run(self, command: str, *, stdin: bytes | None, timeout: float) -> CommandResult:
        return run_by_streaming(self, command, stdin=stdin, timeout=timeout)

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
        if len(stdin or b"") * 4 // 3 > frames.MAX_FRAME - 64 * 1024:
            raise Unavailable()  # more than the server reads in one frame: a channel of its own
        path = socket_path(self.endpoint)
        sock = _connect(path) if path is not None and path.exists() else None
        if sock is None:
            raise Unavailable()
        request = frames.Run(
            id=1,
            command=command,
            stdin=stdin or b"",
            timeout=NO_TIMEOUT if timeout is None else timeout,
            idle_timeout=idle_timeout,
            close_stdin=close_stdin,
        )
        with self._live_lock:
            if self._closed:  # closed while this command was on its way: it must not run
                sock.close()
                raise ConnectError(f"{self.endpoint.name}: the connection was closed")
            self._live.add(sock)
        with sock, self._registered(sock):  # closed on any exception: the server cuts it off
            lines = frames.Lines(sock.recv)
            try:
                sock.sendall(frames.encode(request))
                sock.settimeout(ACK_TIMEOUT)
                if lines.next() != frames.Taken(1):
                    raise Unavailable()
            except (OSError, ValueError):
                raise Unavailable() from None  # an ending server closed it: not run
            STATS.count("persisted")
            # The server keeps the command's deadlines and says when one ran out; this only
            # ends a wait for a server that stopped answering.
            limits = [t for t in (timeout, idle_timeout) if t is not None]
            sock.settimeout(min(limits) + ANSWER_MARGIN if limits else None)
            while True:
                try:
                    frame = lines.next()
                except (OSError, ValueError) as exc:
                    raise self._broken(exc) from None
                match frame:
                    case frames.Output(fd=1, data=data):
                        on_stdout(data)
                    case frames.Output(data=data):
                        on_stderr(data)
                    case frames.Exit(exit=code):
                        return code
                    case frames.Failed():
                        raise_failure(frame)
                    case None:
                        raise self._broken("it closed the socket")
                    case _:
                        raise self._broken(frames.FrameError(f"unexpected {frame}"))

    def _broken(self, reason: object) -> ConnectError:
        return ConnectError(
            f"{self.endpoint.name}: the persisted connection broke off during a command: {reason}"
        )

    @contextlib.contextmanager
    def _registered(self, sock: socket.socket) -> Iterator[None]:
        try:
            yield
        finally:
            with self._live_lock:
                self._live.discard(sock)

    def close(self) -> None:
        """End every command under way: its socket shut down, the server cuts it off."""
        with self._live_lock:
            self._closed = True
            live, self._live = self._live, set()
        for sock in live:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


def start(endpoint: Endpoint) -> bool:
    """Start the background process for `endpoint` unless one answers already; True when one
    was started. It connects on its own; the caller goes on with its own connection."""
    path = socket_path(endpoint) if persistable(endpoint) else None
    if path is None:
        return False
    live = _connect(path) if path.exists() else None
    if live is not None:
        live.close()
        return False
    proc = subprocess.Popen(
        [sys.executable, "-m", "launcher.transport.persistserver"],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # no terminal: Ctrl-C and a closed terminal do not reach it
        close_fds=True,
        cwd="/",
    )
    assert proc.stdin is not None
    with proc.stdin:
        proc.stdin.write(json.dumps(endpoint_doc(endpoint)).encode())
    return True


def stop_all() -> list[Path]:
    """Ask every background process of this user's to end; the sockets that were asked."""
    directory = runtime_dir()
    asked = []
    for path in sorted(directory.glob("*.sock")) if directory else []:
        sock = _connect(path)
        if sock is None:
            continue
        with sock, contextlib.suppress(OSError, ValueError):
            sock.sendall(frames.encode(frames.Stop()))
            frames.Lines(sock.recv, 4096).next_line()
            asked.append(path)
    return asked
