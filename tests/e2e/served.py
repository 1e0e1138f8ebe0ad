"""The tests' CLI calls through launcher's own command server, as Mercurial's run-tests.py
--chg runs its suite through chg.

Each `launcher` a test runs costs a new interpreter and the imports (click, pydantic, the
configuration models, paramiko): 0.3–0.7 s of CPU as measured, hundreds of times per worker, on a
two-core machine. The command server (launcher/cmdserver) has them imported once and forks one
child per command, which takes the caller's argv, environment, cwd, umask and descriptors and
runs what the console script runs (console.run_cli); docs/internals.md says why a child is a
fresh process as far as the command can tell, and tests/local/test_cmdserver.py checks that
nothing computed at import depends on the environment, the cwd or the terminal.

Here each xdist worker has one server of its own, in a runtime directory of its own (so no
test's count of command servers or persisted connections sees it), for the worker's life.
The command's persisted connection, its exit code and its output are its own, as a fresh
process's are. What the server does not run (a command it does not serve, a host that asks
for a passphrase) runs as a fresh process. Tests about timing and the CLI's own start use
fresh processes (Project(served=False), or `python -m launcher` directly). E2E_CLI=process
runs every call as a fresh process.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import locale
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from launcher.entry.cmdserver import client, wire

START_TIMEOUT = 60.0  # the server's imports, on a machine the other workers keep busy
STARTED_TIMEOUT = 20.0  # the fork and the child's inventory look


def enabled() -> bool:
    return os.environ.get("E2E_CLI", "served") != "process"


class Server:
    """This worker's command server (started on first use, ended when the worker exits)."""

    def __init__(self) -> None:
        self.runtime = Path(tempfile.mkdtemp(prefix="ls", dir="/tmp"))  # short: a socket path
        self.fingerprint = wire.fingerprint()
        self.path = self.runtime / "launcher" / f"cmd-{self.fingerprint}"
        self.streams = _fresh_streams()
        self.process = subprocess.Popen(
            client.server_argv(self.path, self.fingerprint, wire.MAX_IDLE),
            env={**os.environ, "XDG_RUNTIME_DIR": str(self.runtime)},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
            cwd="/",
        )
        deadline = time.monotonic() + START_TIMEOUT
        while not self.path.is_socket():
            if self.process.poll() is not None or time.monotonic() > deadline:
                err = self.process.stderr.read().decode() if self.process.stderr else ""
                self.close()
                raise RuntimeError(f"the tests' command server did not start: {err}")
            time.sleep(0.05)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.process.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=5)
        if self.process.poll() is None:
            self.process.kill()
        shutil.rmtree(self.runtime, ignore_errors=True)

    def run(self, argv: list[str], timeout: float) -> subprocess.CompletedProcess[str] | None:
        """`launcher ARGV` in a child of the server, as subprocess.run(capture_output=True,
        text=True, timeout=timeout) runs it in a fresh process; None when the server did not
        take it (nothing ran)."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with (
            sock,
            open(os.devnull, "rb") as stdin,
            tempfile.TemporaryFile() as out,
            tempfile.TemporaryFile() as err,
        ):
            request = wire.Request(
                ["launcher", *argv], os.getcwd(), dict(os.environ), client._umask(), self.streams
            )
            sock.settimeout(STARTED_TIMEOUT)
            sock.connect(str(self.path))
            socket.send_fds(
                sock, [wire.encode(request)], [stdin.fileno(), out.fileno(), err.fileno()]
            )
            started = _receive(sock)
            if not isinstance(started, wire.Started):
                return None  # Declined, or refused unanswered: nothing ran
            sock.send(wire.encode(wire.Go()))
            deadline = time.monotonic() + timeout
            code = None
            while code is None:
                sock.settimeout(max(0.01, deadline - time.monotonic()))
                try:
                    message = _receive(sock)
                except TimeoutError:
                    with contextlib.suppress(OSError):
                        os.kill(started.pid, signal.SIGKILL)  # as subprocess.run kills
                    raise subprocess.TimeoutExpired(argv, timeout, _text(out), _text(err)) from None
                if message is None:
                    code = client.LOST  # ended without an exit code (killed)
                elif isinstance(message, wire.Exited):
                    code = message.code
            return subprocess.CompletedProcess(argv, code, _text(out), _text(err))


def _receive(sock: socket.socket) -> wire.Message | None:
    packet = sock.recv(wire.MAX_PACKET)
    return wire.decode(packet) if packet else None


def _text(file: tempfile._TemporaryFileWrapper[bytes]) -> str:
    """What subprocess.run(text=True) makes of the bytes: the locale's encoding, universal
    newlines."""
    file.seek(0)
    data = file.read().decode(locale.getpreferredencoding(False))
    return data.replace("\r\n", "\n").replace("\r", "\n")


def _fresh_streams() -> list[wire.Stream]:
    """How a fresh interpreter started as Project.launcher starts one (stdin /dev/null, stdout
    and stderr pipes) sets up its streams (locale, UTF-8 mode, line buffering), asked of one."""
    probe = (
        "import json, sys; print(json.dumps([[s.encoding, s.errors, s.line_buffering, "
        "s.write_through] for s in (sys.stdin, sys.stdout, sys.stderr)]))"
    )
    flags = subprocess._args_from_interpreter_flags()  # type: ignore[attr-defined]
    done = subprocess.run(
        [sys.executable, *flags, "-c", probe],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        check=True,
    )
    return [wire.Stream(*spec) for spec in json.loads(done.stdout)]


_server: Server | None = None


def server() -> Server:
    global _server
    if _server is None:
        _server = Server()
        atexit.register(_server.close)
    return _server
