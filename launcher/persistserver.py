"""The background process of a persisted connection (`python -m launcher.persistserver`):
started by persist.start, it opens its own connection to one endpoint and runs the commands
that persist.exchange sends over its Unix socket, until idle for `control_persist` seconds.

The client side (persist.py) is what remote.py uses; this side uses remote.py, so the two
live apart (no import cycle).
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import fcntl
import json
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

from launcher.endpoint import Endpoint
from launcher.errors import CommandTimeout, LauncherError
from launcher.persist import (
    ACK,
    MAX_REQUEST,
    VERSION,
    endpoint_from_doc,
    error_answer,
    peer_uid,
    persistable,
    read_line,
    result_answer,
    socket_path,
)
from launcher.remote import Connection


class Server:
    """Serves one endpoint's commands over its socket until idle for `control_persist` s."""

    def __init__(self, endpoint: Endpoint, path: Path) -> None:
        self.endpoint = endpoint
        # Its own connection never starts another background process.
        self.conn = Connection(dataclasses.replace(endpoint, control_persist=0.0))
        self.path = path
        self.busy = 0
        self.last_used = time.monotonic()
        self.lock = threading.Lock()
        self.stopping = threading.Event()

    def serve(self, listener: socket.socket) -> None:
        listener.settimeout(0.5)
        while not self.stopping.is_set():
            with self.lock:
                idle = self.busy == 0 and (
                    time.monotonic() - self.last_used >= self.endpoint.control_persist
                )
            if idle:
                break
            try:
                client, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                break
            threading.Thread(target=self.handle, args=(client,), daemon=True).start()

    def handle(self, client: socket.socket) -> None:
        with self.lock:
            self.busy += 1
        try:
            with client:
                if peer_uid(client) != os.geteuid():
                    return
                client.settimeout(30.0)
                request = json.loads(read_line(client, MAX_REQUEST) or b"null")
                if self.stopping.is_set():
                    return  # closed unacknowledged: the client connects by itself
                client.sendall(json.dumps(ACK).encode() + b"\n")  # raises if it gave up
                answer = self.answer(request)
                client.settimeout(30.0)
                client.sendall(json.dumps(answer).encode() + b"\n")
        except (OSError, ValueError):
            pass  # the client went away or sent nonsense: nothing to answer
        finally:
            with self.lock:
                self.busy -= 1
                self.last_used = time.monotonic()

    def answer(self, request: object) -> dict[str, Any]:
        if not isinstance(request, dict) or request.get("v") != VERSION:
            return {"ok": False, "kind": "RemoteError", "message": "unknown request"}
        if request.get("op") == "exit":
            self.stopping.set()
            return {"ok": True}
        try:
            stdin = request.get("stdin")
            result = self.conn.run(
                str(request["command"]),
                stdin=None if stdin is None else base64.b64decode(stdin),
                timeout=float(request["timeout"]),
            )
        except LauncherError as error:
            if not isinstance(error, CommandTimeout):
                # The connection itself failed (dropped and not back, a key no longer offered):
                # end, so that the next command connects by itself and says why, instead of
                # every command failing here while keeping this process from going idle.
                self.stopping.set()
            return error_answer(error)
        except (KeyError, TypeError, ValueError) as exc:
            return {"ok": False, "kind": "RemoteError", "message": f"bad request: {exc}"}
        return result_answer(result)


def serve(endpoint: Endpoint) -> int:
    """The background process: one per endpoint (a lock file decides), connected before it
    listens, gone when idle, when asked to end (`launcher disconnect`) or on SIGTERM."""
    path = socket_path(endpoint)
    if path is None or not persistable(endpoint):
        return 2
    lock = os.open(path.with_suffix(".lock"), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return 0  # another one serves this endpoint
    server = Server(endpoint, path)
    try:
        server.conn.run("true", timeout=endpoint.connect_timeout + 30)  # connect before listening
    except LauncherError:
        return 1
    signal.signal(signal.SIGTERM, lambda *_: server.stopping.set())
    with contextlib.suppress(FileNotFoundError):
        path.unlink()  # left by a process that was killed: we hold the lock now
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_umask = os.umask(0o177)
    try:
        listener.bind(str(path))
    finally:
        os.umask(old_umask)
    listener.listen(64)
    try:
        server.serve(listener)
    finally:
        listener.close()
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        server.conn.close()
        os.close(lock)
    return 0


def main() -> int:
    try:
        endpoint = endpoint_from_doc(json.loads(sys.stdin.read()))
    except (ValueError, TypeError, KeyError):
        return 2
    return serve(endpoint)


if __name__ == "__main__":
    sys.exit(main())
