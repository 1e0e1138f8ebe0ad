"""The command server's client, run by the console script before it imports click.

`hand_over(argv)` gives the command to this user's server for this code and waits for its exit
code, the server's child writing straight to this process's stdin, stdout and stderr (their
descriptors travel with the request). SIGINT, SIGTERM and SIGHUP received meanwhile are
forwarded to the child. When there is no server, or it declines, nothing ran and the console
script runs the command itself (`start` then starts a server for the next command).

Standard library only.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import stat
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

from launcher.entry.cmdserver import wire
from launcher.transport.rundir import connect_own, runtime_dir

CONNECT_TIMEOUT = 1.0
STARTED_TIMEOUT = 10.0  # for the child's Started or Declined: the fork and its inventory look
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
LOST = 3  # ExitCode.UNREACHABLE: the child ended without an exit code (it was killed)
# What the background process runs: the module search path set to the client's before anything
# of launcher's is imported, so that it imports what this process would.
BOOT = (
    "import json, sys; a = json.loads(sys.argv[1]); sys.path[:] = a['path']; "
    "from launcher.entry.cmdserver.server import main; sys.exit(main(a))"
)


class NoServer(NamedTuple):
    """Not handed over: run in-process. `start` says whether to start a server for the next
    command (no server answered at `path`)."""

    start: bool
    path: Path | None = None
    fingerprint: str = ""


def hand_over(argv: list[str]) -> int | NoServer:
    """The command's exit code, run by the server; or NoServer when nothing ran there."""
    if wire.command_of(argv) not in wire.SERVED or wire.idle_seconds(os.environ) <= 0:
        return NoServer(start=False)
    try:
        streams = [_stream(s) for s in (sys.stdin, sys.stdout, sys.stderr)]
        for fd in (0, 1, 2):
            os.fstat(fd)
        request = wire.Request(sys.argv[:], os.getcwd(), dict(os.environ), _umask(), streams)
    except (AttributeError, OSError, ValueError):
        return NoServer(start=False)  # a closed stream, a cwd gone: only in-process is exact
    print_ = wire.fingerprint()
    path = wire.socket_path(print_)
    if path is None:
        return NoServer(start=False)
    sock = _connect(path)
    if sock is None:
        return NoServer(start=True, path=path, fingerprint=print_)
    with sock, _forwarding(sock) as child:
        return _converse(sock, request, child)


def _converse(sock: socket.socket, request: wire.Request, child: Child) -> int | NoServer:
    try:
        packet = wire.encode(request)
        if len(packet) > wire.MAX_PACKET:
            return NoServer(start=False)
        sock.settimeout(STARTED_TIMEOUT)
        socket.send_fds(sock, [packet], [0, 1, 2])
        answer = wire.decode(sock.recv(wire.MAX_PACKET) or b"null")
    except (OSError, ValueError):
        return NoServer(start=False)  # nothing ran: no Go was sent
    if not isinstance(answer, wire.Started):
        return NoServer(start=False)  # Declined (a host that prompts on the terminal)
    child.pid = answer.pid  # from now on a signal is forwarded (the child ends before Go)
    if child.received:  # Ctrl-C (or another) before that: no Go, nothing runs
        return _lost(child.received)
    try:
        sock.settimeout(None)
        sock.send(wire.encode(wire.Go()))
        while True:
            packet = sock.recv(wire.MAX_PACKET)
            if not packet:
                break
            message = wire.decode(packet)
            if isinstance(message, wire.Exited):
                return message.code
    except (OSError, ValueError):
        pass
    return _lost(child.received)


def _lost(received: list[int]) -> int:
    """The child ended without an exit code: killed by a signal this process forwarded (end
    the same way), or by something else (say so)."""
    if received and received[-1] != signal.SIGINT:
        signal.signal(received[-1], signal.SIG_DFL)
        os.kill(os.getpid(), received[-1])
    with contextlib.suppress(OSError, ValueError):
        if received:  # as console.interrupted says it
            sys.stderr.write("interrupted\n")
        else:
            sys.stderr.write("launcher: the command's process ended without an exit code\n")
        sys.stderr.flush()
    return 130 if received else LOST  # ExitCode.INTERRUPTED


class Child:
    """The served command's process, as the client sees it."""

    def __init__(self) -> None:
        self.pid = 0  # once Started arrived
        self.received: list[int] = []  # the signals forwarded, in order


@contextlib.contextmanager
def _forwarding(sock: socket.socket) -> Iterator[Child]:
    """SIGINT, SIGTERM and SIGHUP sent on to the child as Signal messages once it started
    (one before that means the command never runs: the client ends as the signal says).
    Ctrl-Z stops the child with the client, and `fg`/`bg` resumes both, as for one process:
    the child's process group is not the terminal's, whose job control cannot reach it."""
    child = Child()

    def forward(signum: int, _frame: Any) -> None:
        child.received.append(signum)
        if child.pid > 0:  # started: the child gets it; before: nothing will run
            with contextlib.suppress(OSError):
                sock.send(wire.encode(wire.Signal(signum)))

    def suspend(_signum: int, _frame: Any) -> None:
        _signal_child(child, signal.SIGSTOP)
        signal.signal(signal.SIGTSTP, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTSTP)  # stopped here until SIGCONT
        signal.signal(signal.SIGTSTP, suspend)
        _signal_child(child, signal.SIGCONT)

    before = {signum: signal.signal(signum, forward) for signum in FORWARDED}
    if signal.getsignal(signal.SIGTSTP) == signal.SIG_DFL:  # not ignored (no job control)
        before[signal.SIGTSTP] = signal.signal(signal.SIGTSTP, suspend)
    try:
        yield child
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)


def _signal_child(child: Child, signum: int) -> None:
    if child.pid > 0:
        with contextlib.suppress(OSError):
            os.kill(child.pid, signum)


def _connect(path: Path) -> socket.socket | None:
    """A connection to a live server of this user's at `path`, or None."""
    return connect_own(path, socket.SOCK_SEQPACKET, CONNECT_TIMEOUT)


def _stream(stream: Any) -> wire.Stream:
    return wire.Stream(
        str(stream.encoding),
        str(stream.errors),
        bool(stream.line_buffering),
        bool(stream.write_through),
    )


def _umask() -> int:
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def server_argv(path: Path, fingerprint: str, idle: float) -> list[str]:
    """The command line of a server listening on `path` for code with this fingerprint, ending
    after `idle` seconds without a command: this interpreter, with its flags and sys.path."""
    import subprocess

    startup = {
        "path": [os.path.abspath(p) for p in sys.path],
        "socket": str(path),
        "fingerprint": fingerprint,
        "idle": idle,
    }
    flags = subprocess._args_from_interpreter_flags()  # type: ignore[attr-defined]
    return [sys.executable, *flags, "-c", BOOT, json.dumps(startup)]


def start(where: NoServer) -> None:
    """Start a server in the background for the next command (detached, as persist.start
    starts a persisted connection): its own session, no terminal, nothing inherited."""
    if where.path is None:
        return
    import subprocess

    with contextlib.suppress(OSError):
        subprocess.Popen(
            server_argv(where.path, where.fingerprint, wire.idle_seconds(os.environ)),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # Ctrl-C and a closed terminal do not reach it
            close_fds=True,
            cwd="/",
        )


def end_all() -> int:
    """End this user's command servers (`launcher disconnect`): each one's socket is removed, so
    no later command reaches it, and it exits within its poll (a command it is running goes on
    to its end); how many there were."""
    directory = runtime_dir()
    ended = 0
    for path in sorted(directory.glob("cmd-*")) if directory else []:
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISSOCK(path.lstat().st_mode):  # not its lock file
                path.unlink()
                ended += 1
    return ended
