"""The command server: a background process, started by client.start, that imports launcher's
CLI and every served command's modules once, then forks one child per command.

The server itself never runs a command: every child starts from the state the imports left,
as a fresh process would (nothing launcher computes at import depends on the environment, the
cwd or the terminal: tests/local/test_cmdserver.py checks it). It has no threads when it forks.

A child takes the client's descriptors as 0, 1 and 2, its environment (os.environ replaced
whole), cwd, umask and argv, runs console.run_cli (what the console script runs), sends the
exit code and ends. A thread of the child's reads the client's socket: a Signal is raised in
the child, the client going away (its end of the socket closed) is a Ctrl-C.
"""

from __future__ import annotations

import contextlib
import fcntl
import gc
import importlib
import io
import os
import pkgutil
import select
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any, NoReturn

from launcher.entry import globalargs
from launcher.entry.cmdserver import wire
from launcher.transport.rundir import listen_private, peer_uid

POLL_SECONDS = 0.5  # how often the server reaps children and looks at its idle time
RECV_TIMEOUT = 2.0  # for a connected client's request
GO_TIMEOUT = 10.0  # for the client's Go after Started
FORWARDED = frozenset((signal.SIGINT, signal.SIGTERM, signal.SIGHUP))
# Imported before the first fork: every module of launcher's but these, so that a served
# command's child imports nothing (tests/e2e/test_cmdserver.py checks it): the agent's modules
# (they run in the container; agentclient reads them as text), the relay's host program, what
# no served command runs (sandbox, watch, buckets, the Fabric tasks, the docs' generator), the
# command server itself and `__main__` modules (importing one runs it).
NOT_PRELOADED = (
    "launcher.agent",
    "launcher.transport.relayhost",
    "launcher.sandbox",
    "launcher.watch",
    "launcher.watch.job",
    "launcher.buckets",
    "launcher.tasks",
    "launcher.entry.docsref",
    "launcher.entry.demo",
    "launcher.entry.cmdserver",
)
# What launcher imports only on a terminal (colours, live lines, tables).
LIBRARIES = ("rich.console", "rich.live", "rich.markup", "rich.progress", "rich.table")
_kept: list[Any] = []  # the server's own stdio objects: closing them would close fds 0-2


def preload() -> None:
    import launcher

    for module in pkgutil.walk_packages(launcher.__path__, "launcher."):
        name = module.name
        skipped = any(name == n or name.startswith(f"{n}.") for n in NOT_PRELOADED)
        if not skipped and not name.endswith(".__main__"):
            importlib.import_module(name)
    for name in LIBRARIES:
        importlib.import_module(name)
    build_models()


def build_models() -> None:
    """Build every configuration model's validator now: they are built on first use
    (`defer_build`, which spares a one-off command ~30 ms), and a child would otherwise build
    them again for every command."""
    from pydantic import BaseModel

    pending: list[type[BaseModel]] = [BaseModel]
    while pending:
        for model in pending.pop().__subclasses__():
            pending.append(model)
            if model.__module__.startswith("launcher."):
                model.model_rebuild(force=True)


class Server:
    """Accepts commands on `listener` until idle for `idle` seconds with no child running."""

    def __init__(self, listener: socket.socket, path: Path, idle: float, lock: int) -> None:
        self.listener = listener
        self.lock = lock  # held while this server lives: no child may hold it after
        self.path = path
        self.inode = path.stat().st_ino
        self.idle = idle
        self.children: set[int] = set()
        self.last_used = time.monotonic()
        self.stopping = False

    def serve(self) -> None:
        while not self.stopping:
            self.reap()
            if not self.children and time.monotonic() - self.last_used >= self.idle:
                return
            if not self.still_listening():
                return  # the socket was removed (its directory too): nobody can reach us
            readable, _, _ = select.select([self.listener], [], [], POLL_SECONDS)
            if readable:
                self.accept()

    def reap(self) -> None:
        for pid in list(self.children):
            with contextlib.suppress(ChildProcessError):
                done, _ = os.waitpid(pid, os.WNOHANG)
                if not done:
                    continue
            self.children.discard(pid)
            self.last_used = time.monotonic()

    def still_listening(self) -> bool:
        try:
            return self.path.stat().st_ino == self.inode
        except OSError:
            return False

    def accept(self) -> None:
        try:
            conn, _ = self.listener.accept()
        except OSError:
            return
        fds: list[int] = []
        with conn:
            try:
                if peer_uid(conn) != os.geteuid():
                    return  # another user's process: it gets nothing, not even an answer
                conn.settimeout(RECV_TIMEOUT)
                packet, fds, flags, _ = socket.recv_fds(conn, wire.MAX_PACKET, 3)
                if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC) or len(fds) != 3:
                    return
                request = wire.decode(packet)
                if not isinstance(request, wire.Request):
                    return
                self.last_used = time.monotonic()
                self.idle = wire.idle_seconds(request.env) or self.idle
                if threading.active_count() != 1:
                    return  # never fork with another thread (its locks would be copied held)
                pid = os.fork()
                if pid == 0:
                    child(conn, (self.listener.fileno(), self.lock), request, fds)
                self.children.add(pid)
            except (OSError, ValueError):
                return
            finally:
                for fd in fds:
                    with contextlib.suppress(OSError):
                        os.close(fd)


# -- a child: one command -----------------------------------------------------------------------


def child(
    conn: socket.socket, servers: tuple[int, int], request: wire.Request, fds: list[int]
) -> NoReturn:
    """One command, in the forked child; never returns into the server's loop. `servers`: the
    server's listening socket and lock, which a child outliving a killed server must not keep."""
    code = 1
    try:
        for fd in servers:
            os.close(fd)
        for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD):
            signal.signal(signum, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            _take_environment(request)
            reason = declines(request.argv[1:])
        except OSError as exc:  # its cwd is gone: in-process it fails the way it does
            reason = f"cannot take the client's cwd: {exc}"
        conn.settimeout(GO_TIMEOUT)
        if reason is not None:
            conn.sendall(wire.encode(wire.Declined(reason)))
            os._exit(0)
        conn.sendall(wire.encode(wire.Started(os.getpid())))
        if wire.decode(conn.recv(wire.MAX_PACKET) or b"null") != wire.Go():
            os._exit(0)  # the client gave up waiting and runs it itself: nothing ran here
        conn.settimeout(None)
        _take_streams(request.streams, fds)
        code = _run(conn)
    except BaseException:  # a child never returns into the server's loop
        code = 1
    os._exit(code)


def _take_environment(request: wire.Request) -> None:
    os.environ.clear()
    os.environ.update(request.env)
    time.tzset()  # TZ: local times as the client's own process would print them
    os.chdir(request.cwd)
    os.umask(request.umask)
    sys.argv = list(request.argv)


def _take_streams(streams: list[wire.Stream], fds: list[int]) -> None:
    """The client's descriptors as 0, 1 and 2, and sys.stdin/stdout/stderr made on them the
    way the client's interpreter made its own (encoding, errors, buffering)."""
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    fds.clear()
    _kept.extend((sys.stdin, sys.stdout, sys.stderr))
    made = []
    for fd, spec in enumerate(streams):
        binary = open(fd, "rb" if fd == 0 else "wb", closefd=False)  # noqa: SIM115 - kept open
        made.append(
            io.TextIOWrapper(
                binary,
                encoding=spec.encoding,
                errors=spec.errors,
                newline="\n",  # as Python's own on POSIX
                line_buffering=spec.line_buffering,
                write_through=spec.write_through,
            )
        )
    sys.stdin, sys.stdout, sys.stderr = made
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = made  # type: ignore[misc]
    from launcher.entry.console import TolerantStream

    sys.stderr = TolerantStream(made[2])  # a reader gone never ends the command


def _run(conn: socket.socket) -> int:
    from launcher.entry import console

    threading.Thread(target=_watch, args=(conn,), daemon=True).start()
    try:
        code = console.run_cli()
    except KeyboardInterrupt:  # before the CLI's own handler: what console.interrupted says
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.write("interrupted\n")
            sys.stderr.flush()
        code = 130
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the client leaving now changes nothing
    with contextlib.suppress(OSError):
        conn.sendall(wire.encode(wire.Exited(code)))
    return code


def _watch(conn: socket.socket) -> None:
    """The client's signals raised here; its end of the socket closing (killed, gone) is a
    Ctrl-C: the command ends as an interrupted one does."""
    while True:
        try:
            packet = conn.recv(wire.MAX_PACKET)
        except OSError:
            packet = b""
        if not packet:
            os.kill(os.getpid(), signal.SIGINT)
            return
        try:
            message = wire.decode(packet)
        except ValueError:
            continue
        if isinstance(message, wire.Signal) and message.signum in FORWARDED:
            os.kill(os.getpid(), message.signum)


def declines(args: list[str]) -> str | None:
    """Why the client must run this command itself, decided before anything runs: a host in
    its inventory whose key's passphrase is typed on the terminal (the child has none, as a
    persisted connection's process has none: persist.unattended). An inventory that does not
    load is the command's to report."""
    from launcher.config.models import inventory_path, load_inventory

    try:
        inventory = load_inventory(inventory_path(inventory_option(args)))
    except Exception:  # any failure is the command's to report, in the child
        return None
    for name, host in sorted(inventory.spec.hosts.items()):
        if host.passphrase == "prompt":
            return f"host {name} asks for its key's passphrase on the terminal"
    return None


def inventory_option(args: list[str]) -> str | None:
    """-i/--inventory's value, before or after the command's name (the last one wins)."""
    return globalargs.read(args).last("--inventory")


# -- the process --------------------------------------------------------------------------------


def main(startup: dict[str, Any]) -> int:
    """The background process: one per fingerprint (a lock file decides), its imports done
    before it listens, gone when idle, when its socket is removed or on SIGTERM."""
    try:
        path, print_ = Path(startup["socket"]), str(startup["fingerprint"])
        idle = float(startup["idle"])
    except (KeyError, TypeError, ValueError):
        return 2
    if wire.fingerprint() != print_ or wire.socket_path(print_) != path or idle <= 0:
        return 2  # not the code the client runs
    lock = os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return 0  # another one serves this code
    preload()
    if wire.fingerprint() != print_ or threading.active_count() != 1:
        return 2  # changed while importing, or an import started a thread: fork is unsafe
    # What the imports made lives as long as the process: out of the collector's sight, so
    # that a child's collections neither walk it (tens of ms) nor write to its pages (each
    # write copies a page the child shares with the server).
    gc.collect()
    gc.freeze()
    listener = listen_private(path, socket.SOCK_SEQPACKET)  # we hold the lock now
    server = Server(listener, path, idle, lock)

    def stop(*_: object) -> None:
        server.stopping = True

    signal.signal(signal.SIGTERM, stop)
    try:
        server.serve()
    finally:
        listener.close()
        if server.still_listening():
            path.unlink()
        os.close(lock)
    return 0
