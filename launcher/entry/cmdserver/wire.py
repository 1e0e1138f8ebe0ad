"""The command server's messages, where it listens, and which commands it serves.

Standard library only: the client imports this before click. One message a packet of a Unix
SOCK_SEQPACKET socket (boundaries kept by the kernel; the request carries the client's stdin,
stdout and stderr as SCM_RIGHTS file descriptors), each a JSON object whose "type" names one of
the classes below; `decode` checks every field's type and refuses anything else.

client -> server   Request (argv, cwd, environment, umask, how its streams are set up; fds 0-2)
server -> client   Started (the child took it, nothing ran yet) or Declined (run it yourself)
client -> server   Go (the child may run it), then any number of Signal (forwarded)
server -> client   Exited (the command's exit code), then the socket closes
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any, NamedTuple

from launcher.entry import globalargs
from launcher.transport.rundir import runtime_dir

PROTOCOL = 1
MAX_PACKET = 1 << 20  # a request (argv and the environment) larger than this runs in-process
ENV = "LAUNCHER_CONTROL_PERSIST"  # persist.DEFAULT_ENV: the server lives as long as it says
MAX_IDLE = 24 * 3600.0  # persist.MAX_IDLE
# The commands a server runs. Not attach (it needs the terminal as its controlling tty), watch
# and job (long-running processes of their own, or phases that gain nothing), sandbox (root
# work on this machine), inventory/buckets/completion/disconnect (no connection: nothing to
# save but the imports, and disconnect ends what a server's children use).
SERVED = frozenset(
    ("status", "verify", "smoke", "logs", "stop", "history", "rollback", "deploy", "doctor")
)


class WireError(ValueError):
    """A packet that is not one of the messages, or not the one expected."""


class Stream(NamedTuple):
    """How the client's interpreter set up sys.stdin/stdout/stderr (Python decides at start
    from the locale, PYTHONIOENCODING and whether the stream is a terminal): the child sets
    up its own the same way on the same descriptors."""

    encoding: str
    errors: str
    line_buffering: bool
    write_through: bool


class Request(NamedTuple):
    argv: list[str]
    cwd: str
    env: dict[str, str]
    umask: int
    streams: list[Stream]


class Started(NamedTuple):
    pid: int


class Declined(NamedTuple):
    reason: str


class Go(NamedTuple):
    pass


class Signal(NamedTuple):
    signum: int


class Exited(NamedTuple):
    code: int


Message = Request | Started | Declined | Go | Signal | Exited
_TYPES: dict[str, type[Any]] = {
    cls.__name__: cls for cls in (Request, Started, Declined, Go, Signal, Exited)
}
_FIELDS: dict[str, dict[str, type]] = {
    "Request": {"argv": list, "cwd": str, "env": dict, "umask": int, "streams": list},
    "Started": {"pid": int},
    "Declined": {"reason": str},
    "Go": {},
    "Signal": {"signum": int},
    "Exited": {"code": int},
}


def encode(message: Message) -> bytes:
    doc: dict[str, Any] = {"type": type(message).__name__, **message._asdict()}
    return json.dumps(doc, separators=(",", ":")).encode()


def decode(packet: bytes) -> Message:
    """A packet back into its message, every field's type checked."""
    try:
        doc = json.loads(packet)
    except (ValueError, UnicodeDecodeError) as exc:
        raise WireError(f"not JSON: {exc}") from None
    if not isinstance(doc, dict) or doc.get("type") not in _TYPES:
        raise WireError("not a message")
    name = doc.pop("type")
    fields = _FIELDS[name]
    if set(doc) != set(fields):
        raise WireError(f"{name}: keys {sorted(doc)}, expected {sorted(fields)}")
    for key, kind in fields.items():
        if not isinstance(doc[key], kind) or (kind is int and isinstance(doc[key], bool)):
            raise WireError(f"{name}.{key}: not a {kind.__name__}")
    if name == "Request":
        return _request(doc)
    message: Message = _TYPES[name](**doc)
    return message


def _request(doc: dict[str, Any]) -> Request:
    argv, env, streams = doc["argv"], doc["env"], doc["streams"]
    if not all(isinstance(a, str) for a in argv):
        raise WireError("Request.argv: not strings")
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise WireError("Request.env: not strings")
    checked = []
    for stream in streams:
        kinds = (str, str, bool, bool)
        if not isinstance(stream, list) or len(stream) != 4:
            raise WireError("Request.streams: not three streams")
        if not all(isinstance(v, k) for v, k in zip(stream, kinds, strict=True)):
            raise WireError("Request.streams: wrong types")
        checked.append(Stream(*stream))
    if len(checked) != 3:
        raise WireError("Request.streams: not three streams")
    return Request(argv, doc["cwd"], env, doc["umask"], checked)


# -- which commands, where -----------------------------------------------------------------------


def command_of(argv: list[str]) -> str | None:
    """The command's name: the first word that is no option (nor an option's value) of the
    group's (cli/main.py)."""
    return globalargs.read(argv).command


def idle_seconds(env: dict[str, str] | os._Environ[str]) -> float:
    """How long a server waits for the next command: LAUNCHER_CONTROL_PERSIST's seconds, as a
    persisted connection (0 or anything that is not a number within 0..MAX_IDLE: no server)."""
    try:
        seconds = float(env.get(ENV, "0"))
    except ValueError:
        return 0.0
    return seconds if 0.0 < seconds <= MAX_IDLE else 0.0


def fingerprint() -> str:
    """Of the code a server would run: the interpreter (path, version, flags, PYTHON* and locale
    variables, the module search path, each entry's mtime: a package installed or upgraded
    changes it)
    and every launcher source file's size and mtime. A changed launcher is never served by a
    server started before the change: its socket has another name."""
    digest = hashlib.sha256()
    python = [
        PROTOCOL,
        sys.executable,
        sys.version,
        list(sys.flags),
        sorted(sys._xoptions.items()) if hasattr(sys, "_xoptions") else [],
        # what Python read at start: its own variables and the locale (stdio's encoding)
        sorted((k, v) for k, v in os.environ.items() if k.startswith(("PYTHON", "LC_", "LANG"))),
        [os.path.abspath(p) for p in sys.path],
    ]
    digest.update(json.dumps(python, default=str).encode())
    for entry in sys.path[1:]:  # not the script's directory or the cwd: its mtime churns
        digest.update(f"{_stamp(entry)}\n".encode())
    package = Path(__file__).resolve().parents[2]  # launcher/
    for folder, dirs, files in os.walk(package):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                digest.update(f"{os.path.relpath(path, package)} {_stamp(path)}\n".encode())
    return digest.hexdigest()[:32]


def _stamp(path: str) -> str:
    try:
        info = os.stat(path or ".")
    except OSError:
        return "-"
    return f"{info.st_size} {info.st_mtime_ns} {info.st_ino}"


def socket_path(print_: str) -> Path | None:
    """The server's socket for this code, in the user's private directory (None: no such
    directory, nothing is served). No `.sock` suffix: persist.stop_all's sockets are those."""
    directory = runtime_dir()
    return None if directory is None else directory / f"cmd-{print_}"
