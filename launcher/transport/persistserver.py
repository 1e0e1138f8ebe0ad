"""The background process of a persisted connection (`python -m launcher.transport.persistserver`):
started by persist.start, it opens its own connection to one endpoint and runs the commands
that persist.PersistedRunner sends over its Unix socket (frames.py's frames, output streamed as
it comes), until idle for `control_persist` seconds.

Its commands travel through a relay on the host (relay.py) when they can: the host's sshd
session and login shell are then paid once for as long as this process lives, not once per
command (measured in `./run bench`: see the CHANGELOG). A command that keeps its stdin open
(`logs -f`), or every command on a host that cannot relay, gets a channel of its own.

The client side (persist.py) is what connection.py uses; this side uses ssh.py, so the two live
apart (no import cycle).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import select
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from launcher.core.errors import CommandTimeout, LauncherError
from launcher.transport import frames
from launcher.transport.endpoint import Endpoint
from launcher.transport.persist import endpoint_from_doc, failure_frame, persistable, socket_path
from launcher.transport.relay import Relay
from launcher.transport.rundir import listen_private, peer_uid
from launcher.transport.runner import first_taker
from launcher.transport.ssh import SSHConnection

SEND_TIMEOUT = 30.0  # a client that reads nothing for this long has gone away
POLL_SECONDS = 0.5  # how often a command's watcher looks whether its client went away


class Server:
    """Serves one endpoint's commands over its socket until idle for `control_persist` s."""

    def __init__(self, endpoint: Endpoint, path: Path) -> None:
        self.endpoint = endpoint
        # Its own connection never starts another background process.
        self.conn = SSHConnection(dataclasses.replace(endpoint, control_persist=0.0))
        self.relay = Relay(self.conn)  # started by the first command it can carry
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
                client.settimeout(SEND_TIMEOUT)
                request = frames.Lines(client.recv).next()
                if isinstance(request, frames.Stop):
                    self.stopping.set()
                    client.sendall(frames.encode(frames.Taken(0)))
                elif isinstance(request, frames.Run) and not self.stopping.is_set():
                    # Taken before it runs (raises if the client gave up): a command whose
                    # Taken was not delivered is not run, and the client connects by itself.
                    client.sendall(frames.encode(frames.Taken(request.id)))
                    self.run(client, request)
                # anything else (or while ending): closed unanswered
        except (OSError, ValueError):
            pass  # the client went away or sent nonsense: nothing to answer
        finally:
            with self.lock:
                self.busy -= 1
                self.last_used = time.monotonic()

    def run(self, client: socket.socket, request: frames.Run) -> None:
        """The command on this process's connection, its output sent as it arrives. The
        client's socket closing (Ctrl-C, its reader gone) cuts the command off at once."""
        send_lock = threading.Lock()
        gone = threading.Event()  # the client went away
        done = threading.Event()  # the command ended

        def send(frame: frames.Frame) -> None:
            with send_lock:
                client.sendall(frames.encode(frame))

        def watch() -> None:
            # Nothing more is expected from the client: its socket turning readable is its
            # end (EOF) or a Cancel. Not a read with the socket's timeout, which would take
            # a quiet command for a gone client.
            while not done.is_set():
                try:
                    readable, _, _ = select.select([client], [], [], POLL_SECONDS)
                except (OSError, ValueError):
                    readable = [client]
                if readable:
                    gone.set()
                    return

        threading.Thread(target=watch, daemon=True).start()
        rid = request.id
        try:
            code = self.stream(request, send, gone)
        except LauncherError as error:
            if gone.is_set():
                return  # nobody to tell
            if not isinstance(error, CommandTimeout):
                # The connection itself failed (dropped and not back, a key no longer offered):
                # end, so that the next command connects by itself and says why, instead of
                # every command failing here while keeping this process from going idle.
                self.stopping.set()
            send(failure_frame(rid, error))
            return
        finally:
            done.set()
        send(frames.Exit(rid, code))

    def stream(
        self, request: frames.Run, send: Callable[[frames.Frame], None], gone: threading.Event
    ) -> int:
        """The command through the relay, or on a channel of its own when the relay cannot
        take it (it keeps its stdin open, or the host cannot relay: nothing ran then)."""
        rid = request.id
        runners: tuple[Relay | SSHConnection, ...] = (self.relay, self.conn)
        return first_taker(
            runners,
            lambda runner: runner.stream(
                request.command,
                lambda data: send(frames.Output(rid, 1, data)),
                lambda data: send(frames.Output(rid, 2, data)),
                stdin=request.stdin,
                close_stdin=request.close_stdin,
                timeout=request.timeout,
                idle_timeout=request.idle_timeout,
                cancel=gone,
            ),
        )


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
        server.conn.connect()  # before listening: a client finds a connected server or none
    except LauncherError:
        return 1
    signal.signal(signal.SIGTERM, lambda *_: server.stopping.set())
    listener = listen_private(path, socket.SOCK_STREAM)  # we hold the lock now
    try:
        server.serve(listener)
    finally:
        listener.close()
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        server.relay.close()
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
