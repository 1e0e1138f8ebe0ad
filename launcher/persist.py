"""Persisted connections: a host's SSH connection kept open between commands.

With `control_persist: SECONDS` on a host, the first command that connects to it also starts a
small background process (`python -m launcher.persistserver`) that opens a connection of its own and
runs later commands' remote commands over a Unix socket, until nothing used it for SECONDS.
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
- Only plain commands travel this way (polls, logs, history, stop, pushes); streamed ones (a
  deploy's transaction, `logs -f`) open a connection of their own, as before.
- A socket that does not answer (its process was killed) only means the command connects by
  itself and starts a new background process; an answer that breaks off mid-command is a
  connection error, as when a direct connection drops: the command is not run a second time.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import hashlib
import json
import os
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from launcher.errors import (
    AuthError,
    CommandTimeout,
    ConnectError,
    HostKeyError,
    LauncherError,
    RemoteError,
)

if TYPE_CHECKING:
    from launcher.endpoint import CommandResult, Endpoint

VERSION = 1
ANSWER_MARGIN = 10.0  # seconds past the command's own deadline before the answer is given up
ACK = {"taken": True}  # the server's first line: it will run the command
ACK_TIMEOUT = 5.0
MAX_REQUEST = 64 * 1024 * 1024  # a pushed script travels as stdin
ERRORS: dict[str, type[LauncherError]] = {
    cls.__name__: cls for cls in (CommandTimeout, ConnectError, HostKeyError, AuthError)
}
_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


# -- where -------------------------------------------------------------------------------------


def runtime_dir() -> Path | None:
    """The user's private directory for sockets, made if missing; None when it is not a real
    directory owned by the user with mode 0700 (then nothing is persisted)."""
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    base = Path(xdg) / "launcher" if xdg and os.path.isabs(xdg) else None
    if base is None or len(str(base)) > 60:  # a socket path must fit in 108 bytes
        base = Path(f"/tmp/launcher-{os.geteuid()}")
    with contextlib.suppress(FileExistsError, FileNotFoundError):
        base.mkdir(mode=0o700)
    try:
        info = base.lstat()
    except OSError:
        return None
    private = info.st_uid == os.geteuid() and info.st_mode & 0o077 == 0
    return base if os.path.isdir(base) and not base.is_symlink() and private else None


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
    from launcher.endpoint import Endpoint

    via = endpoint_from_doc(doc["via"]) if doc.get("via") else None
    fields = {**doc, "via": via, "known_hosts": Path(doc["known_hosts"])}
    fields["identity_files"] = tuple(doc["identity_files"])
    return Endpoint(**fields)


def socket_path(endpoint: Endpoint) -> Path | None:
    directory = runtime_dir()
    if directory is None:
        return None
    key = json.dumps(endpoint_doc(endpoint), sort_keys=True).encode()
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


# The idle seconds for a host whose inventory sets no control_persist. The console script sets
# it to INTERACTIVE_IDLE on an interactive terminal (console.py); a user may set it (0: off).
DEFAULT_ENV = "LAUNCHER_CONTROL_PERSIST"
INTERACTIVE_IDLE = 60.0  # as Ansible's ssh connection (ControlPersist=60s)
MAX_IDLE = 24 * 3600.0  # what the inventory allows (config.HostSpec.control_persist)


def default_idle(passphrase: str) -> float:
    """control_persist for a host whose inventory leaves it unset: LAUNCHER_CONTROL_PERSIST's
    seconds, if it is a number within 0..MAX_IDLE (anything else: off); always off for a host
    whose key is unlocked on the terminal, which a background process cannot do."""
    if passphrase == "prompt":
        return 0.0
    try:
        seconds = float(os.environ.get(DEFAULT_ENV, "0"))
    except ValueError:
        return 0.0
    return seconds if 0.0 <= seconds <= MAX_IDLE else 0.0


def persistable(endpoint: Endpoint) -> bool:
    """A host whose connection a background process can open (and is asked to keep)."""
    return unattended(endpoint) and endpoint.control_persist > 0


def peer_uid(sock: socket.socket) -> int:
    data = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
    return int(_PEERCRED.unpack(data)[1])


class Lines:
    """Newline-ended messages from a socket, one at a time (a read may hold more than one)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = b""

    def next(self, limit: int) -> bytes:
        """The next line (b"" if the peer closed first); ValueError past `limit` bytes."""
        while b"\n" not in self.buffer:
            if len(self.buffer) > limit:
                raise ValueError("message too large")
            chunk = self.sock.recv(65536)
            if not chunk:
                return b""
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line


def read_line(sock: socket.socket, limit: int) -> bytes:
    return Lines(sock).next(limit)


def b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode()


# -- the client side ---------------------------------------------------------------------------


def _connect(path: Path) -> socket.socket | None:
    """A connection to a live background process of this user's at `path`, or None."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(2.0)
        sock.connect(str(path))
        if peer_uid(sock) != os.geteuid():
            raise OSError("the socket is served by another user")
        return sock
    except OSError:
        sock.close()
        return None


class BrokenOff(Exception):
    """The background process took the command but gave no answer."""


def exchange(
    path: Path, command: str, stdin: bytes | None, timeout: float
) -> dict[str, Any] | None:
    """Send one command to the background process at `path` and return its answer as it came;
    None when nothing there took it (then it did not run: the server acknowledges a command
    before it runs it, and runs none whose acknowledgement it could not deliver)."""
    sock = _connect(path) if path.exists() else None
    if sock is None:
        return None
    request = {"v": VERSION, "op": "run", "command": command, "stdin": b64(stdin)}
    request["timeout"] = timeout
    with sock:
        lines = Lines(sock)
        try:
            sock.sendall(json.dumps(request).encode() + b"\n")
            sock.settimeout(ACK_TIMEOUT)
            if json.loads(lines.next(4096) or b"null") != ACK:
                return None
        except (OSError, ValueError):
            return None  # an ending server closed it, or never read it: not run
        try:
            sock.settimeout(timeout + ANSWER_MARGIN)
            answer = json.loads(lines.next(MAX_REQUEST * 2) or b"null")
        except (OSError, ValueError) as exc:
            raise BrokenOff(str(exc)) from None
    if not isinstance(answer, dict):
        raise BrokenOff("it closed the socket")
    return answer


def run(
    endpoint: Endpoint, command: str, *, stdin: bytes | None, timeout: float
) -> CommandResult | None:
    """Run `command` through the host's persisted connection; None when there is none (the
    caller then connects by itself)."""
    path = socket_path(endpoint)
    if path is None:
        return None
    started = time.monotonic()
    try:
        answer = exchange(path, command, stdin, timeout)
    except BrokenOff as exc:
        raise ConnectError(
            f"{endpoint.name}: the persisted connection broke off during a command: {exc}"
        ) from None
    if answer is None:
        return None
    return answer_result(answer, command, time.monotonic() - started)


def result_answer(result: CommandResult) -> dict[str, Any]:
    """A command's result as another process hands it over (JSON)."""
    return {
        "ok": True,
        "exit": result.exit_code,
        "out": b64(result.stdout),
        "err": b64(result.stderr),
    }


def error_answer(error: LauncherError) -> dict[str, Any]:
    """A command's failure as another process hands it over (JSON)."""
    return {"ok": False, "kind": type(error).__name__, "message": error.message, "hint": error.hint}


def answer_result(answer: dict[str, Any], command: str, duration: float) -> CommandResult:
    """The result another process handed over (result_answer), or its failure raised (the
    same kind of error, with its message and hint: error_answer)."""
    from launcher.endpoint import CommandResult

    if not answer.get("ok"):
        error = ERRORS.get(str(answer.get("kind")), RemoteError)
        raise error(str(answer.get("message")), hint=answer.get("hint"))
    out, err = base64.b64decode(answer["out"]), base64.b64decode(answer["err"])
    return CommandResult(command, int(answer["exit"]), out, err, duration)


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
        [sys.executable, "-m", "launcher.persistserver"],
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
        with sock, contextlib.suppress(OSError):
            sock.sendall(json.dumps({"v": VERSION, "op": "exit"}).encode() + b"\n")
            read_line(sock, 4096)
            asked.append(path)
    return asked
