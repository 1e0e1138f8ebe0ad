"""`launcher status` sends its one remote command while its configuration is still loading.

Loading the inventory and playbook (pydantic and the config models) takes a Python client
~0.2 s; the poll's round trip takes about as long. When the host's connection is persisted
(persist.py), the command needs no SSH library, so it can go first: the last `status` with the
same inventory, target and working directory left a hint (the socket, the exact command and
its stdin, the deadline) next to the persisted connection's socket; the next one sends that
command in a thread at once, then loads the configuration as always, and uses the early answer
only when the command it would send now is byte for byte the one sent early (same socket, so
the same resolved endpoint; same command and stdin, so the same request). Otherwise the answer
is dropped and the command sent again, so nothing the configuration says is ever skipped: a
poll is read-only, and a stale hint costs one extra poll, never a wrong status.

stdlib only (and persist.py): importing this must cost nothing.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
from pathlib import Path
from typing import Any

from launcher import persist

HINT_VERSION = 1
_lock = threading.Lock()
_key: str | None = None  # this process's hint name, once begin() was called
_early: _Early | None = None
_recorded: dict[str, Any] | None = None


class _Early:
    """The command from the hint, sent in a thread."""

    def __init__(self, path: Path, command: str, stdin: bytes | None, timeout: float) -> None:
        self.sent = (str(path), command, stdin, timeout)
        self.answer: dict[str, Any] | None = None
        self.thread = threading.Thread(target=self._send, args=self.sent, daemon=True)
        self.thread.start()

    def _send(self, path: str, command: str, stdin: bytes | None, timeout: float) -> None:
        with contextlib.suppress(Exception):  # any failure: the caller sends it itself
            self.answer = persist.exchange(Path(path), command, stdin, timeout)

    def wait(self) -> dict[str, Any] | None:
        self.thread.join(self.sent[3] + persist.ANSWER_MARGIN)
        return self.answer


def _hint_path(key: str) -> Path | None:
    directory = persist.runtime_dir()
    return None if directory is None else directory / f"hint-{key}.json"


def _stamp(path: str) -> list[int] | None:
    try:
        info = os.stat(path)
    except OSError:
        return None
    return [info.st_ino, info.st_size, info.st_mtime_ns]


def begin(*key: object) -> None:
    """Send the hinted command for this invocation (`key`: what selects the run, e.g. the
    inventory option and the target names), if a hint is there and its files are unchanged."""
    global _key, _early
    parts = [HINT_VERSION, os.getcwd(), os.environ.get("LAUNCHER_INVENTORY"), *key]
    _key = hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:32]
    path = _hint_path(_key)
    try:
        assert path is not None
        hint = json.loads(path.read_text())
        if any(_stamp(name) != stamp for name, stamp in hint["files"]):
            return  # the configuration changed since: let the normal path send
        stdin = None if hint["stdin"] is None else bytes.fromhex(hint["stdin"])
        socket_path = Path(hint["socket"])
        if socket_path.parent != path.parent:
            return  # a hint points only at sockets of this private directory
        _early = _Early(socket_path, str(hint["command"]), stdin, float(hint["timeout"]))
    except (AssertionError, OSError, ValueError, KeyError, TypeError):
        return


def take(path: Path, command: str, stdin: bytes | None, timeout: float) -> dict[str, Any] | None:
    """The early answer, if the early command is exactly this one (then it is used once)."""
    global _early
    with _lock:
        early, _early = _early, None
    if early is None or early.sent != (str(path), command, stdin, timeout):
        return None
    return early.wait()


def record(path: Path, command: str, stdin: bytes | None, timeout: float) -> None:
    """The first command this process sent through a persisted connection: the next hint."""
    global _recorded
    with _lock:
        if _key is not None and _recorded is None:
            _recorded = {
                "socket": str(path),
                "command": command,
                "stdin": None if stdin is None else stdin.hex(),
                "timeout": timeout,
            }


def finish(files: list[Path]) -> None:
    """Leave the hint for the next invocation with the same key: what was sent, and the files
    (inventory, playbook) whose change makes it stale."""
    path = _hint_path(_key) if _key is not None else None
    if path is None or _recorded is None:
        return
    hint = {**_recorded, "files": [[str(f), _stamp(str(f))] for f in files]}
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with contextlib.suppress(OSError):
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as handle:
            json.dump(hint, handle)
        os.replace(tmp, path)
