"""A command's first remote work starts while its configuration is still loading.

Loading the inventory and playbook (pydantic and the config models) takes a Python client
~0.2 s; connecting and starting the agent in the container take about as long again, and are
mostly waiting for the other side. The last run of the same command line (the same arguments,
working directory, LAUNCHER_INVENTORY and LAUNCHER_TARGET) on one target left a hint next to the
persisted connections' sockets; the next run acts on it at once (launcher.console, before click
or pydantic are imported), in a thread, and then loads its configuration as always:

- persisted connection (`launcher status` on a `control_persist` host): the hint is the exact
  command and stdin of the last poll; it is sent through the persisted connection at once, and
  its answer is used only when the command the configuration then asks for is byte for byte the
  one sent early (same socket, so the same resolved endpoint; same command and stdin, so the
  same request). A poll is read-only: a stale hint costs one extra poll, never a wrong status.
- direct connection (status, deploy, verify, logs, stop, ...): the hint is the resolved endpoint
  and the agent's command line. The thread connects (host keys checked as always) and starts
  the agent, which waits for its request line on stdin before it does anything
  (protocol.BOOT). The connection is used only when the endpoint the configuration resolves to
  now is the one in the hint, and the started agent only when the command is the same; the
  request, built from the configuration just loaded, is then written to it. Anything else is
  closed unused: the agent reads end of file and exits having done nothing.
- direct connection, status (keep_request): the hint also holds the poll. A child process
  (forked first thing, _EarlyPoll) connects, sends it and hands the answer back on a pipe,
  on a core of its own while this one loads the configuration; the answer is used under the
  same rule as above (the same endpoint, the same command and request), else the command
  polls by itself.

Hints live in the user's private directory (persist.runtime_dir), carry the stamps of the files
that decide them (inventory, playbook, ssh_config), and are ignored once any of those changed.

stdlib only (persist.py; launcher.protocol and the SSH layer only when a hint is there).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import select
import shlex
import signal
import socket
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from launcher import persist

if TYPE_CHECKING:
    from launcher.errors import LauncherError
    from launcher.remote import CommandResult, Connection, Endpoint

HINT_VERSION = 2
KEY_VARIABLES = ("LAUNCHER_INVENTORY", "LAUNCHER_TARGET")  # what selects the run, besides argv
IMPORT_WAIT = 2.0  # seconds a command waits for the early thread's imports, at most
CONNECT_WAIT = 0.15  # and then for its SSH handshake, at most (one on a LAN takes ~0.1 s)
# While the early thread connects: how soon a thread woken by the network gets the interpreter
# lock from one that computes (Python's default is 0.005 s).
SWITCH_INTERVAL = 0.0005
# Besides the files a command names: what decides a direct hint's endpoint.
SSH_CONFIG_FILES = (Path("~/.ssh/config").expanduser(), Path("/etc/ssh/ssh_config"))
_lock = threading.Lock()
_key: str | None = None  # this process's hint name, once begin() was called
_early: _Early | None = None
_early_agent: _EarlyAgent | None = None  # until adopt() hands its connection over
_early_poll: _EarlyPoll | None = None  # until take_direct() is asked for its request
_adopted: _EarlyAgent | None = None  # after: its early request's answer, until taken
_send_request = False  # keep_request(): the next hint keeps the request too
_recorded: dict[str, Any] | None = None


class _Early:
    """The command from a persisted hint, sent in a thread."""

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


class _EarlyAgent:
    """A direct connection opened from a hint, the agent's command started on it, and (for a
    read-only command: status's poll) its request sent too."""

    def __init__(
        self,
        endpoint: dict[str, Any],
        command: str,
        request: tuple[bytes, float] | None,
    ) -> None:
        self.doc = endpoint
        self.command = command
        self.request = request  # (stdin, timeout) to send at once, or None
        self.conn: Connection | None = None
        self.result: CommandResult | None = None
        self.error: LauncherError | None = None
        self.imported = threading.Event()
        self.connected = threading.Event()  # the handshake is over (or failed)
        self.started = threading.Event()  # connected and the agent started, or failed
        # Python runs one thread at a time. The SSH libraries' imports would only interleave
        # with the configuration's, so they go first, alone (the command waits for them), and
        # so does the handshake, whose key exchange and authentication are this process's
        # work as much as sshd's (measured: a deploy 0.07 s sooner than with the configuration
        # loading beside it). Opening the channel and the agent's start are the host's time
        # (sshd, the shell, pct, python3): the configuration loads meanwhile, and each packet
        # that wakes paramiko's thread gets the lock within SWITCH_INTERVAL instead of a 5 ms
        # slice. A slow link's handshake is waited for only CONNECT_WAIT: the rest overlaps.
        self.switch_interval = sys.getswitchinterval()
        sys.setswitchinterval(SWITCH_INTERVAL)
        self.thread = threading.Thread(target=self._start, daemon=True)
        self.thread.start()
        self.imported.wait(IMPORT_WAIT)
        self.connected.wait(CONNECT_WAIT)

    def _start(self) -> None:
        try:
            self.conn = _connection(self.doc)  # the SSH libraries' imports, see __init__
            from launcher.errors import LauncherError

            self.imported.set()
            # A failed connect stays in conn, which then fails fast with the same error.
            self.conn.connect()
            self.connected.set()
            self.conn.prestart(self.command)
        except Exception:
            return
        finally:
            self.imported.set()
            self.connected.set()
            self.started.set()
            sys.setswitchinterval(self.switch_interval)
        if self.request is not None:
            stdin, timeout = self.request
            try:
                self.result = self.conn.run_direct(self.command, stdin=stdin, timeout=timeout)
            except LauncherError as error:
                self.error = error

    def answer(self, command: str, stdin: bytes | None, timeout: float) -> CommandResult | None:
        """The early request's result if it is exactly this one (its error raised as it came,
        being what this request would get); else None."""
        if self.request is None or (command, stdin, timeout) != (self.command, *self.request):
            return None
        self.thread.join(timeout + persist.ANSWER_MARGIN)
        if self.error is not None:
            raise type(self.error)(self.error.message, hint=self.error.hint)
        return self.result

    def close(self) -> None:
        """Unused: closed in the background (the agent reads end of file, does nothing)."""

        def close() -> None:
            self.thread.join(60)
            if self.conn is not None:
                with contextlib.suppress(Exception):
                    self.conn.close()

        threading.Thread(target=close, daemon=True).start()


class _EarlyPoll:
    """status's poll from a direct hint, sent by a child process of this one (forked before
    anything else is imported, so with no thread to inherit): its SSH imports, handshake and
    wait for the host's answer run on their own core while this process loads its
    configuration, instead of taking turns with it for the interpreter lock. The child hands
    the answer (or the connection's failure) back on a pipe and exits; this process never
    connects for it. Unused, its pipe is closed: the child's write fails and it ends."""

    def __init__(self, doc: dict[str, Any], command: str, stdin: bytes, timeout: float) -> None:
        self.doc = doc
        self.sent = (command, stdin, timeout)
        self.started = time.monotonic()
        read_end, write_end = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:
            os.close(read_end)
            _poll_for_parent(write_end, doc, command, stdin, timeout)
        os.close(write_end)
        self.read_end = read_end

    def answer(self, endpoint: Endpoint) -> dict[str, Any] | None:
        """The child's answer (persist.result_answer/error_answer) if it polled exactly this
        endpoint (the caller has matched the request); else None, and the caller polls by
        itself."""
        if persist.endpoint_from_doc(self.doc) != endpoint:
            self.close()
            return None
        timeout = self.sent[2]
        deadline = time.monotonic() + endpoint.connect_timeout + timeout + persist.ANSWER_MARGIN
        data = bytearray()
        try:
            while (left := deadline - time.monotonic()) > 0:
                if not select.select([self.read_end], [], [], left)[0]:
                    break
                chunk = os.read(self.read_end, 1 << 16)
                if not chunk:
                    with contextlib.suppress(ChildProcessError):
                        os.waitpid(self.pid, 0)  # it exits as soon as its end is closed
                    answer = json.loads(data)
                    return answer if isinstance(answer, dict) and "ok" in answer else None
                data += chunk
            os.kill(self.pid, signal.SIGKILL)  # past every deadline of its own: stuck
            os.waitpid(self.pid, 0)
            return None
        except (OSError, ValueError):
            return None  # it died before it answered: the caller polls by itself
        finally:
            self.close()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.read_end)


def _poll_for_parent(
    write_end: int, doc: dict[str, Any], command: str, stdin: bytes, timeout: float
) -> NoReturn:
    """The child of _EarlyPoll: connect, poll, write the answer, exit (never returns)."""
    try:
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # Ctrl-C ends it with its parent
        # Nothing of the parent's: a reader of the parent's output waits for no child of it.
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        conn = _connection(doc)
        from launcher.errors import LauncherError

        try:
            conn.connect()
            answer = persist.result_answer(conn.run_direct(command, stdin=stdin, timeout=timeout))
        except LauncherError as error:
            answer = persist.error_answer(error)
        with open(write_end, "wb") as pipe:
            pipe.write(json.dumps(answer).encode())
    finally:
        os._exit(0)


def _connection(doc: dict[str, Any]) -> Connection:
    """The (not yet connected) Connection to a hint's endpoint, its TCP connection started
    before the SSH libraries are imported (early_socket)."""
    sock = early_socket(doc)
    from launcher import sshopen  # noqa: F401  (the SSH libraries)
    from launcher.remote import Connection

    conn = Connection(persist.endpoint_from_doc(doc))
    if sock is not None:
        conn.give_socket(sock)
    return conn


def early_socket(doc: dict[str, Any]) -> socket.socket | None:
    """A TCP connection to a hint's endpoint (a direct one: no jump host, no ProxyCommand),
    started before the SSH libraries load and left to complete meanwhile (non-blocking): the
    TCP handshake's round trip and the server's start (sshd execs a process per connection
    before its banner) overlap the imports. The connection's first attempt waits for it within
    its own connect budget (remote.Connection.give_socket), so a host gone dark costs no more
    than before. Any failure here: None, and that attempt connects as always."""
    if doc.get("via") or doc.get("proxy_command"):
        return None
    sock = None
    try:
        address = socket.getaddrinfo(
            str(doc["hostname"]), int(doc["port"]), type=socket.SOCK_STREAM
        )
        family, kind, proto, _, where = address[0]
        sock = socket.socket(family, kind, proto)
        sock.setblocking(False)
        if sock.connect_ex(where) not in (0, errno.EINPROGRESS):
            raise ConnectionError("refused at once")
        return sock
    except (OSError, KeyError, TypeError, ValueError, IndexError):
        if sock is not None:
            sock.close()
        return None


def _hint_path(key: str) -> Path | None:
    directory = persist.runtime_dir()
    return None if directory is None else directory / f"hint-{key}.json"


def _stamp(path: str) -> list[int] | None:
    try:
        info = os.stat(path)
    except OSError:
        return None
    return [info.st_ino, info.st_size, info.st_mtime_ns]


def is_agent_command(command: str) -> bool:
    """`pct exec VMID -- <the agent's argv>`: a command that does nothing until its request
    line arrives on stdin, so it may be started before the request is known."""
    from launcher.protocol import AGENT_ARGV

    try:
        argv = shlex.split(command)
    except ValueError:
        return False
    return argv[:2] == ["pct", "exec"] and argv[3:] == ["--", *AGENT_ARGV] and argv[2].isdigit()


def begin(argv: Sequence[str]) -> None:
    """Act on the hint the last run of this exact command line left (same arguments, working
    directory and LAUNCHER_* variables), if there is one and its files are unchanged. Called
    before anything else is imported: a hint is only ever left by a command that went on to
    load its configuration and act on one target with it (cli.targets), so a hint's endpoint
    and command are what this command line last resolved to."""
    global _key, _early, _early_agent, _early_poll
    parts = [HINT_VERSION, os.getcwd(), *(os.environ.get(v) for v in KEY_VARIABLES), *argv]
    _key = hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:32]
    path = _hint_path(_key)
    try:
        assert path is not None
        hint = json.loads(path.read_text())
        if any(_stamp(name) != stamp for name, stamp in hint["files"]):
            return  # the configuration changed since: let the normal path send
        stdin = None if hint.get("stdin") is None else bytes.fromhex(hint["stdin"])
        if stdin is not None and not _is_poll(stdin):
            return  # only a poll, which changes nothing, is ever sent before it is asked for
        if "endpoint" in hint:
            command = str(hint["command"])
            request = None if stdin is None else (stdin, float(hint["timeout"]))
            if not is_agent_command(command) or not isinstance(hint["endpoint"], dict):
                return
            if request is not None and hasattr(os, "fork"):
                _early_poll = _EarlyPoll(hint["endpoint"], command, *request)
            else:
                _early_agent = _EarlyAgent(hint["endpoint"], command, request)
            return
        socket_path = Path(hint["socket"])
        if socket_path.parent != path.parent:
            return  # a hint points only at sockets of this private directory
        _early = _Early(socket_path, str(hint["command"]), stdin, float(hint["timeout"]))
    except (AssertionError, OSError, ValueError, KeyError, TypeError, AttributeError):
        return


def keep_request() -> None:
    """This command's first request is a poll (status): the next hint keeps it, so that the
    next run can send it before its configuration has said what it is (and use the answer
    only if it then asks for exactly that)."""
    global _send_request
    _send_request = True


def _is_poll(stdin: bytes) -> bool:
    """The agent's stdin line carries a poll request (the only op sent early)."""
    line = json.loads(stdin.decode())
    return isinstance(line, dict) and line["request"]["op"] == "poll"


def take(path: Path, command: str, stdin: bytes | None, timeout: float) -> dict[str, Any] | None:
    """The early answer, if the early command is exactly this one (then it is used once)."""
    global _early
    with _lock:
        early, _early = _early, None
    if early is None or early.sent != (str(path), command, stdin, timeout):
        return None
    return early.wait()


def adopt(endpoint: Endpoint) -> Connection | None:
    """The connection opened early, if it is to exactly this endpoint (then it is handed over
    once, connected or with the failure that a connect here would repeat); else None, and it
    is kept for another host this command connects to (a cluster target asks its entry node
    first, then the node that runs the container)."""
    global _early_agent, _adopted
    with _lock:
        early = _early_agent
        if early is None or persist.endpoint_from_doc(early.doc) != endpoint:
            return None
        _early_agent = None
    early.started.wait(endpoint.connect_timeout + persist.ANSWER_MARGIN)
    conn = early.conn
    if not early.started.is_set() or conn is None:
        early.close()
        return None
    _adopted = early
    return conn


def polling() -> bool:
    """A child process is polling for this command (_EarlyPoll), its answer not yet taken."""
    return _early_poll is not None


def take_direct(
    conn: Connection, command: str, stdin: bytes | None, timeout: float
) -> CommandResult | None:
    """The answer to a request sent early, if it is exactly this one to exactly this
    connection's endpoint (then it is used once): by a child process (_EarlyPoll), or on the
    adopted connection `conn`; else None."""
    global _adopted, _early_poll
    with _lock:
        poll = _early_poll
        if poll is not None and poll.sent != (command, stdin, timeout):
            poll = None  # another request: kept for the one it was sent for
        if poll is not None:
            _early_poll = None
    if poll is not None:
        answer = poll.answer(conn.endpoint)
        if answer is not None:
            duration = time.monotonic() - poll.started
            return persist.answer_result(answer, command, duration)
    with _lock:
        early = _adopted
        if early is None or early.conn is not conn:
            return None
        _adopted = None
    return early.answer(command, stdin, timeout)


def record(path: Path, command: str, stdin: bytes | None, timeout: float) -> None:
    """The first command this process sent through a persisted connection: the next hint,
    for a command that keeps its request (keep_request: status's poll); for any other, the
    next run connects to the persisted connection as always."""
    if not _send_request:
        return
    _record(
        {
            "socket": str(path),
            "command": command,
            "stdin": None if stdin is None else stdin.hex(),
            "timeout": timeout,
        }
    )


def record_direct(endpoint: Endpoint, command: str, stdin: bytes | None, timeout: float) -> None:
    """The first agent command this process started on a direct connection: the next hint
    (a host whose key needs a passphrase typed on the terminal is never started early). The
    request itself is kept only for a poll (keep_request)."""
    if _key is None or _recorded is not None or not is_agent_command(command):
        return
    if not persist.unattended(endpoint):
        return
    hint: dict[str, Any] = {"endpoint": persist.endpoint_doc(endpoint), "command": command}
    if _send_request and stdin is not None:
        hint.update(stdin=stdin.hex(), timeout=timeout)
    _record(hint)


def _record(hint: dict[str, Any]) -> None:
    global _recorded
    with _lock:
        if _key is not None and _recorded is None:
            _recorded = hint


def finish(files: list[Path]) -> None:
    """Leave the hint for the next invocation with the same key: what was sent, and the files
    (inventory, playbook; ssh_config for a direct one) whose change makes it stale."""
    path = _hint_path(_key) if _key is not None else None
    if path is None or _recorded is None:
        return
    if "endpoint" in _recorded:
        files = [*files, *SSH_CONFIG_FILES]
    hint = {**_recorded, "files": [[str(f), _stamp(str(f))] for f in files]}
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with contextlib.suppress(OSError):
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as handle:
            json.dump(hint, handle)
        os.replace(tmp, path)
