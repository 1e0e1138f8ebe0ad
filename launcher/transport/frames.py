"""The one frame format of the relay (over an SSH channel) and of the persisted connection
(over a Unix socket): one JSON object a line, bytes as base64, every frame checked on read.

  to the runner:   Run {id, command, stdin, timeout[, idle_timeout, close_stdin]}
                   Cancel {cancel: id}            give up a command (its pipes are closed)
                   Stop {stop: true}              a persisted connection: end (`disconnect`)
  from the runner: Hello {hello: VERSION}         the relay, once, when it is ready
                   Taken {id, taken: true}        a persisted connection will run the command
                   Output {id, fd: 1 | 2, data}   output as it arrives
                   Exit {id, exit: code}          the command's end
                   Failed {id, kind, message, hint}  a persisted connection's error (its kind
                                                  one of launcher.core.errors': CommandTimeout, ...)

The relay's host program (relayhost.py, run by the host's python3) writes and reads the same
frames with the standard library alone; a frame that is not one of these, or whose fields have
the wrong types, is a FrameError (a ValueError) naming what is wrong, never a KeyError later.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

VERSION = 2  # the relay's hello, and part of a persisted connection's socket name
MAX_FRAME = 96 * 1024 * 1024  # a pushed script travels as one Run frame's stdin (base64)


class FrameError(ValueError):
    """A line that is not a valid frame."""


@dataclass(frozen=True)
class Run:
    id: int
    command: str
    stdin: bytes
    timeout: float
    idle_timeout: float | None = None  # enforced by a persisted connection (the relay: client)
    close_stdin: bool = True  # False: stdin stays open until the command is cancelled


@dataclass(frozen=True)
class Cancel:
    cancel: int


@dataclass(frozen=True)
class Stop:
    pass


@dataclass(frozen=True)
class Hello:
    hello: int


@dataclass(frozen=True)
class Taken:
    id: int


@dataclass(frozen=True)
class Output:
    id: int
    fd: Literal[1, 2]
    data: bytes


@dataclass(frozen=True)
class Exit:
    id: int
    exit: int


@dataclass(frozen=True)
class Failed:
    id: int
    kind: str
    message: str
    hint: str | None = None


Frame = Run | Cancel | Stop | Hello | Taken | Output | Exit | Failed


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def to_doc(frame: Frame) -> dict[str, Any]:
    """The frame as its JSON object."""
    match frame:
        case Run():
            doc: dict[str, Any] = {
                "id": frame.id,
                "command": frame.command,
                "stdin": _b64(frame.stdin),
                "timeout": frame.timeout,
            }
            if frame.idle_timeout is not None:
                doc["idle_timeout"] = frame.idle_timeout
            if not frame.close_stdin:
                doc["close_stdin"] = False
            return doc
        case Cancel():
            return {"cancel": frame.cancel}
        case Stop():
            return {"stop": True}
        case Hello():
            return {"hello": frame.hello}
        case Taken():
            return {"id": frame.id, "taken": True}
        case Output():
            return {"id": frame.id, "fd": frame.fd, "data": _b64(frame.data)}
        case Exit():
            return {"id": frame.id, "exit": frame.exit}
        case Failed():
            return {
                "id": frame.id,
                "kind": frame.kind,
                "message": frame.message,
                "hint": frame.hint,
            }


def encode(frame: Frame) -> bytes:
    return json.dumps(to_doc(frame), separators=(",", ":")).encode() + b"\n"


class _Fields:
    """A frame's JSON object read key by key, each checked for its type."""

    def __init__(self, doc: dict[str, Any], kind: str, allowed: set[str]) -> None:
        extra = set(doc) - allowed
        if extra:
            raise FrameError(f"{kind} frame with unknown keys {sorted(extra)}")
        self.doc = doc
        self.kind = kind

    def get(self, key: str, types: type | tuple[type, ...], *, optional: bool = False) -> Any:
        if key not in self.doc:
            if optional:
                return None
            raise FrameError(f"{self.kind} frame without {key!r}")
        value = self.doc[key]
        # bool is an int to isinstance; no numeric field here takes true/false
        if isinstance(value, bool) and bool not in (
            types if isinstance(types, tuple) else (types,)
        ):
            raise FrameError(f"{self.kind} frame: {key!r} is {value!r}")
        if not isinstance(value, types):
            raise FrameError(f"{self.kind} frame: {key!r} is {type(value).__name__}")
        return value

    def data(self, key: str) -> bytes:
        try:
            return base64.b64decode(self.get(key, str), validate=True)
        except binascii.Error as exc:
            raise FrameError(f"{self.kind} frame: {key!r} is not base64: {exc}") from None


_NUMBER = (int, float)


def _run(f: _Fields) -> Run:
    idle = f.get("idle_timeout", _NUMBER, optional=True)
    close = f.get("close_stdin", bool, optional=True)
    return Run(
        id=f.get("id", int),
        command=f.get("command", str),
        stdin=f.data("stdin"),
        timeout=float(f.get("timeout", _NUMBER)),
        idle_timeout=None if idle is None else float(idle),
        close_stdin=True if close is None else close,
    )


def _output(f: _Fields) -> Output:
    fd = f.get("fd", int)
    if fd not in (1, 2):
        raise FrameError(f"output frame for fd {fd}")
    return Output(id=f.get("id", int), fd=fd, data=f.data("data"))


def _failed(f: _Fields) -> Failed:
    hint = f.get("hint", (str, type(None)), optional=True)
    return Failed(
        id=f.get("id", int), kind=f.get("kind", str), message=f.get("message", str), hint=hint
    )


# Each frame told by the key only it has: its reader and every key it may carry.
_READERS: dict[str, tuple[str, set[str], Callable[[_Fields], Frame]]] = {
    "command": ("run", {"id", "command", "stdin", "timeout", "idle_timeout", "close_stdin"}, _run),
    "cancel": ("cancel", {"cancel"}, lambda f: Cancel(f.get("cancel", int))),
    "stop": ("stop", {"stop"}, lambda f: Stop()),
    "hello": ("hello", {"hello"}, lambda f: Hello(f.get("hello", int))),
    "taken": ("taken", {"id", "taken"}, lambda f: Taken(f.get("id", int))),
    "fd": ("output", {"id", "fd", "data"}, _output),
    "exit": ("exit", {"id", "exit"}, lambda f: Exit(f.get("id", int), f.get("exit", int))),
    "kind": ("failed", {"id", "kind", "message", "hint"}, _failed),
}


def decode(line: bytes) -> Frame:
    """The frame on one line; FrameError for anything else."""
    try:
        doc = json.loads(line)
    except (ValueError, UnicodeDecodeError) as exc:
        raise FrameError(f"not JSON: {line[:80]!r} ({exc})") from None
    if not isinstance(doc, dict):
        raise FrameError(f"not a JSON object: {line[:80]!r}")
    found = [key for key in _READERS if key in doc]
    if len(found) != 1:
        raise FrameError(f"not a frame: {line[:80]!r}")
    kind, allowed, read = _READERS[found[0]]
    return read(_Fields(doc, kind, allowed))


class Lines:
    """Newline-ended frames from a byte source (`recv`: b"" at its end), one at a time."""

    def __init__(self, recv: Callable[[int], bytes], limit: int = MAX_FRAME) -> None:
        self.recv = recv
        self.limit = limit
        self.buffer = b""

    def next_line(self) -> bytes | None:
        """The next line; None if the source ended first; FrameError past the limit."""
        while b"\n" not in self.buffer:
            if len(self.buffer) > self.limit:
                raise FrameError(f"a frame longer than {self.limit} bytes")
            chunk = self.recv(65536)
            if not chunk:
                return None
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line

    def next(self) -> Frame | None:
        """The next frame; None if the source ended first."""
        line = self.next_line()
        return None if line is None else decode(line)
