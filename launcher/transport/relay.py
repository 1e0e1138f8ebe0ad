"""One SSH channel carries the commands of every target a command has on one host.

A command on a channel of its own costs the host an sshd session and a login shell, whose
startup files run each time (root's ~/.bashrc: measured here at about 0.1 s); `verify --all`
on 16 containers polls each one every interval, so the host paid that 16 times a round. When a
command has several targets on one host (fleet.run_fleet, watch), their connection starts the
relay once: a small stdlib-only Python program that the login shell starts on the host, which
runs each command line it is sent with `/bin/sh -c` (the same one parse as the login shell's:
every line is built by container.py with one shlex.join), concurrently, and sends back its
output as it comes and its exit code. `pct exec` still runs once per call; only the session and
the shell around it are paid once. A persisted connection's process (persistserver.py) starts
one too, for every command it carries while it lives.

Its frames are frames.py's (Run, Cancel; Hello, Output, Exit); its host program is
relayhost.py, sent as source on the channel's first line.
A command the client gives up on (its deadline, idle timeout, Ctrl-C, a sink that failed: a
cancel), or every command when the client goes away (the relay's stdin closes), is cut off as
a dropped channel would cut it: its pipes are closed (EOF on stdin, EPIPE on output) and it is
not killed, so a deploy transaction, which outlives its client on purpose, still completes. The
relay also gives up on a command BACKSTOP seconds after the client's deadline. A host without
python3 (or one that ends the relay before its hello) is not relayed: its commands get channels
of their own, as before. A relay that breaks fails the calls it carried (as a dropped channel
would); the next call starts a new one.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import queue
import shlex
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from launcher.transport import endpoint as failures
from launcher.transport import frames
from launcher.transport.endpoint import CommandResult
from launcher.transport.runner import STATS, Sink, Unavailable, run_by_streaming

if TYPE_CHECKING:
    import paramiko

    from launcher.transport.ssh import SSHConnection

# The relay's own deadline on a command is the client's plus this: the client normally cancels
# first; this ends a command whose client has gone away without closing the channel.
BACKSTOP = 30.0
NO_TIMEOUT = 7 * 86400.0  # a stream without a deadline (bounded by its idle timeout instead)
CANCEL_POLL = 0.5  # how often a command with a `cancel` event looks at it
# A command with more stdin than this (a project's files) gets a channel of its own: on the
# relay's one channel its frame would hold up every other command's while it travels, and the
# host's relay would hold it in memory several times over (the line, its base64, the bytes).
MAX_STDIN = 1024 * 1024

# Runs on the host under `python3 -I -S` (Python 3.5+, standard library only).
SOURCE = (Path(__file__).parent / "relayhost.py").read_text()
# The command line: a short loader that takes the source from the first stdin line (so `ps`
# shows a short line, as for the agent). The trailing comment names the process.
COMMAND = shlex.join(
    [
        "python3",
        "-I",
        "-S",
        "-c",
        "import json,sys;exec(json.loads(sys.stdin.readline()))#launcher_relay",
    ]
)

Item = tuple[str, Any]  # ("data", (fd, bytes)) | ("exit", code) | ("broken", ConnectError)


class _Call:
    def __init__(self) -> None:
        self.items: queue.Queue[Item] = queue.Queue()


class Relay:
    """The relay on one host, over one channel of `conn`, started on the first call."""

    def __init__(self, conn: SSHConnection) -> None:
        self.conn = conn
        self._lock = threading.Lock()  # starting, stopping, the pending calls
        self._send_lock = threading.Lock()
        self._channel: paramiko.Channel | None = None
        self._calls: dict[int, _Call] = {}
        self._ids = itertools.count(1)
        self.unavailable = False
        # As many commands at once as the host would take channels (see Endpoint.max_sessions).
        self._slots = threading.BoundedSemaphore(conn.endpoint.max_sessions)

    # -- the channel ------------------------------------------------------------------------
    def _started(self) -> paramiko.Channel:
        with self._lock:
            if self._channel is not None:
                return self._channel
            if self.unavailable:
                raise Unavailable()
            ep = self.conn.endpoint
            channel = self.conn.open_command(COMMAND, ep.connect_timeout)
            try:
                channel.sendall((json.dumps(SOURCE) + "\n").encode())
                hello = frames.decode(_read_line(channel, time.monotonic() + ep.connect_timeout))
                if hello != frames.Hello(frames.VERSION):
                    raise ValueError(hello)
            except (OSError, ValueError, EOFError, TimeoutError):
                self.unavailable = True
                self.conn.close_command(channel)
                raise Unavailable() from None
            self._channel = channel
            threading.Thread(target=self._read, args=(channel,), daemon=True).start()
            return channel

    def _read(self, channel: paramiko.Channel) -> None:
        """Hands each frame to its call, until the channel ends; then fails what is pending."""
        lines = frames.Lines(channel.recv)
        try:
            while (frame := lines.next()) is not None:
                self._dispatch(frame)
        except Exception as exc:  # a broken link or a garbled frame: the relay is done for
            reason = f"{exc}"
        else:
            reason = "the relay ended"
        self._broken(channel, reason)

    def _dispatch(self, frame: frames.Frame) -> None:
        if not isinstance(frame, frames.Output | frames.Exit):
            raise frames.FrameError(f"the relay sent {frame}")
        call = self._calls.get(frame.id)
        if call is None:
            return  # a call that was given up (timed out, cancelled)
        if isinstance(frame, frames.Exit):
            call.items.put(("exit", frame.exit))
        else:
            call.items.put(("data", (frame.fd, frame.data)))

    def _broken(self, channel: paramiko.Channel, reason: str) -> None:
        with self._lock:
            ours = self._channel is channel  # else close() took it (and closes it)
            if ours:
                self._channel = None
            calls, self._calls = self._calls, {}
        error = failures.link_error(self.conn.endpoint, reason)
        for call in calls.values():
            call.items.put(("broken", error))
        if ours:
            self.conn.close_command(channel)

    def _send(self, channel: paramiko.Channel, frame: frames.Frame) -> None:
        with self._send_lock:
            channel.sendall(frames.encode(frame))

    # -- commands ---------------------------------------------------------------------------
    def run(self, command: str, *, stdin: bytes | None, timeout: float) -> CommandResult:
        return run_by_streaming(self, command, stdin=stdin, timeout=timeout)

    def stream(
        self,
        command: str,
        on_stdout: Sink,
        on_stderr: Sink,
        *,
        stdin: bytes | None,
        close_stdin: bool = True,
        timeout: float | None,
        idle_timeout: float | None = None,
        cancel: threading.Event | None = None,
    ) -> int:
        """Run `command` on the host; its output goes to the sinks as it arrives (in this
        thread); its exit code is returned. Raises Unavailable when the host cannot relay, the
        command keeps its stdin open or has more than MAX_STDIN of it, or the relay ended before
        the command reached it (nothing ran), CommandTimeout, ConnectError, or what
        a sink raised. `cancel` set (a persisted connection's client went away): the command
        is given up, and ConnectError, as ssh.SSHConnection.stream does."""
        if not close_stdin or len(stdin or b"") > MAX_STDIN:
            raise Unavailable()  # the relay hands a command all its stdin at once, in one frame
        channel = self._started()
        ep = self.conn.endpoint
        started = time.monotonic()
        deadline = None if timeout is None else started + timeout
        if not self._slots.acquire(timeout=timeout):
            raise failures.busy_error(ep, timeout, command)
        rid = next(self._ids)
        call = _Call()
        with self._lock:
            self._calls[rid] = call
        finished = False
        try:
            request = frames.Run(
                id=rid,
                command=command,
                stdin=stdin or b"",
                timeout=(NO_TIMEOUT if timeout is None else timeout) + BACKSTOP,
            )
            try:
                self._send(channel, request)
            except OSError:
                # Nothing ran: the relay runs only a whole frame (it ended, or its channel
                # broke, before this reader noticed). The next runner takes the command.
                finished = True
                raise Unavailable() from None
            quiet_since = time.monotonic()
            while True:
                if cancel is not None and cancel.is_set():
                    raise failures.link_error(ep, "the client went away")
                waits = [NO_TIMEOUT]
                if deadline is not None:
                    waits.append(deadline - time.monotonic())
                if idle_timeout is not None:
                    waits.append(quiet_since + idle_timeout - time.monotonic())
                if cancel is not None:
                    waits.append(CANCEL_POLL)
                try:
                    kind, value = call.items.get(timeout=max(0.0, min(waits)))
                except queue.Empty:
                    now = time.monotonic()
                    if deadline is not None and now >= deadline:
                        raise failures.deadline_error(ep, timeout, command) from None
                    if idle_timeout is not None and now >= quiet_since + idle_timeout:
                        raise failures.idle_error(ep, idle_timeout, command) from None
                    continue  # a look at `cancel` was due
                if kind != "data":
                    finished = True
                    if kind == "broken":
                        raise value
                    STATS.count("relayed")
                    return int(value)
                fd, data = value
                quiet_since = time.monotonic()
                (on_stdout if fd == 1 else on_stderr)(data)
        finally:
            with self._lock:
                self._calls.pop(rid, None)
            if not finished:  # given up here (deadline, a sink's error, Ctrl-C): end it there
                with contextlib.suppress(OSError):
                    self._send(channel, frames.Cancel(rid))
            self._slots.release()

    def close(self) -> None:
        """Closes the channel: the relay ends whatever still runs and exits."""
        with self._lock:
            channel, self._channel = self._channel, None
        if channel is not None:
            self.conn.close_command(channel)


def _read_line(channel: paramiko.Channel, deadline: float) -> bytes:
    """The first line the relay sends (its hello), within `deadline`."""
    data = b""
    while b"\n" not in data:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError()
        channel.settimeout(left)
        chunk = channel.recv(4096)
        if not chunk:
            raise EOFError()
        data += chunk
    channel.settimeout(None)
    line, _, rest = data.partition(b"\n")
    if rest:
        raise ValueError("a frame before any command was sent")
    return line
