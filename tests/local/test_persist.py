"""Persisted connections, with a fake connection behind a real socket
(the sandbox tests in tests/e2e/test_persist.py run the real background process)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from launcher.core.errors import CommandTimeout, ConnectError
from launcher.transport import frames, persist, persistserver, rundir
from launcher.transport.endpoint import CommandResult, Endpoint
from launcher.transport.runner import Unavailable


def endpoint(**overrides: Any) -> Endpoint:
    values: dict[str, Any] = {
        "name": "pve",
        "hostname": "10.0.0.5",
        "port": 22,
        "user": "root",
        "identity_files": ("/keys/id",),
        "known_hosts": Path("/kh"),
        "accept_new": False,
        "jump": None,
        "connect_timeout": 5.0,
        "command_timeout": 60.0,
        "control_persist": 30.0,
    }
    values.update(overrides)
    return Endpoint(**values)


class FakeConnection:
    """Answers `stream` from a script of (command -> result or exception); anything else
    fails."""

    def __init__(self) -> None:
        self.ran: list[tuple[str, bytes | None, float | None]] = []
        self.answers: dict[str, CommandResult | Exception] = {}

    def stream(
        self,
        command: str,
        on_stdout: Callable[[bytes], None],
        on_stderr: Callable[[bytes], None],
        *,
        stdin: bytes | None,
        close_stdin: bool,
        timeout: float | None,
        idle_timeout: float | None,
        cancel: threading.Event,
    ) -> int:
        self.ran.append((command, stdin, timeout))
        answer = self.answers[command]  # KeyError: an unexpected command
        if isinstance(answer, Exception):
            raise answer
        on_stdout(answer.stdout)
        on_stderr(answer.stderr)
        return answer.exit_code

    def close(self) -> None:
        pass


@pytest.fixture
def runtime(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    short = Path(f"/tmp/lu{os.getpid()}-{tmp_path.name[-8:]}")
    short.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(short))
    yield short  # type: ignore[misc]
    for path in sorted(short.rglob("*"), reverse=True):
        path.rmdir() if path.is_dir() else path.unlink()
    short.rmdir()


class FakeRelay(FakeConnection):
    """A relay (relay.Relay): refuses, as the real one does, a command that keeps its stdin open
    (nothing ran); `unavailable`: a host that cannot relay, which refuses every command."""

    def __init__(self, *, unavailable: bool = False) -> None:
        super().__init__()
        self.unavailable = unavailable
        self.refused: list[str] = []

    def stream(self, command: str, *args: Any, close_stdin: bool, **kwargs: Any) -> int:
        if self.unavailable or not close_stdin:
            self.refused.append(command)
            raise Unavailable()
        return super().stream(command, *args, close_stdin=close_stdin, **kwargs)


def fake_server(ep: Endpoint, path: Path, conn: object, relay: FakeRelay | None = None) -> Any:
    """A Server whose connection and relay are fakes (by default a host that cannot relay)."""
    server = persistserver.Server(ep, path)
    server.conn = conn  # type: ignore[assignment]
    server.relay = relay or FakeRelay(unavailable=True)  # type: ignore[assignment]
    return server


@contextlib.contextmanager
def serving(runtime: Path, relay: FakeRelay) -> Iterator[tuple[Endpoint, FakeConnection]]:
    """A Server for `endpoint()` on its real socket, its connection and its relay fakes."""
    ep = endpoint()
    path = persist.socket_path(ep)
    assert path is not None and path.parent == runtime / "launcher"
    fake = FakeConnection()
    server = fake_server(ep, path, fake, relay)
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(path))
    listener.listen(8)
    thread = threading.Thread(target=server.serve, args=(listener,), daemon=True)
    thread.start()
    yield ep, fake
    server.stopping.set()
    thread.join(5)
    listener.close()
    path.unlink()


@pytest.fixture
def served(runtime: Path) -> Iterator[tuple[Endpoint, FakeConnection]]:
    """A server on a host that cannot relay: every command on a channel of its own."""
    with serving(runtime, FakeRelay(unavailable=True)) as served:
        yield served


def ok(out: bytes = b"out", code: int = 0) -> CommandResult:
    return CommandResult("x", code, out, b"err", 0.1)


def run(ep: Endpoint, command: str, *, stdin: bytes | None, timeout: float) -> CommandResult | None:
    """The command through the persisted connection; None when no server took it."""
    try:
        return persist.PersistedRunner(ep).run(command, stdin=stdin, timeout=timeout)
    except Unavailable:
        return None


# --------------------------------------------------------------------------- where


def test_runtime_dir_is_private_or_nothing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    base = Path(f"/tmp/lr-unit-{os.getpid()}")
    base.mkdir(mode=0o700, exist_ok=True)
    try:
        monkeypatch.setenv("XDG_RUNTIME_DIR", str(base))
        assert rundir.runtime_dir() == base / "launcher"
        assert (base / "launcher").stat().st_mode & 0o777 == 0o700
        (base / "launcher").chmod(0o755)  # someone else could list and plant
        assert rundir.runtime_dir() is None
        (base / "launcher").rmdir()
        (base / "launcher").symlink_to(tmp_path)
        assert rundir.runtime_dir() is None
        (base / "launcher").unlink()
        monkeypatch.setenv("XDG_RUNTIME_DIR", "/" + "x" * 80)  # too long for a socket path
        assert rundir.runtime_dir() == Path(f"/tmp/launcher-{os.geteuid()}")
    finally:
        for path in sorted(base.rglob("*"), reverse=True):
            path.rmdir() if path.is_dir() and not path.is_symlink() else path.unlink()
        base.rmdir()


def test_endpoint_travels_whole_and_any_change_is_another_socket(runtime: Path) -> None:
    hop = endpoint(name="bastion", hostname="b", passphrase="agent", control_persist=0.0)
    ep = endpoint(via=hop, proxy_command=None)
    assert persist.endpoint_from_doc(json.loads(json.dumps(persist.endpoint_doc(ep)))) == ep
    base = persist.socket_path(ep)
    for change in ({"port": 2222}, {"user": "ops"}, {"identity_files": ()}, {"via": None}):
        assert persist.socket_path(dataclasses.replace(ep, **change)) != base


def test_a_host_needing_a_typed_passphrase_is_never_persisted() -> None:
    assert persist.persistable(endpoint())
    assert not persist.persistable(endpoint(control_persist=0.0))
    assert not persist.persistable(endpoint(passphrase="prompt"))
    hop = endpoint(name="bastion", passphrase="prompt")
    assert not persist.persistable(endpoint(via=hop))


# --------------------------------------------------------------------------- client and server


def test_run_goes_through_the_server(served: tuple[Endpoint, FakeConnection]) -> None:
    ep, fake = served
    fake.answers["pct exec 200 -- true"] = ok(b"\x00\xffbinary", code=3)
    result = run(ep, "pct exec 200 -- true", stdin=b"\x00in", timeout=7.0)
    assert result is not None
    assert (result.exit_code, result.stdout, result.stderr) == (3, b"\x00\xffbinary", b"err")
    assert fake.ran == [("pct exec 200 -- true", b"\x00in", 7.0)]


def test_commands_go_through_the_relay_and_open_stdin_on_a_channel(runtime: Path) -> None:
    """The host's session and login shell paid once: a command the relay can carry goes through
    it; one that keeps its stdin open (logs -f) gets a channel, and so does every command on a
    host that cannot relay (the `served` fixture)."""
    relay = FakeRelay()
    with serving(runtime, relay) as (ep, fake):
        relay.answers["pct exec 200 -- true"] = ok(b"relayed", code=0)
        result = run(ep, "pct exec 200 -- true", stdin=b"in", timeout=7.0)
        assert result is not None and result.stdout == b"relayed"
        assert relay.ran == [("pct exec 200 -- true", b"in", 7.0)] and fake.ran == []

        fake.answers["tail -f log"] = ok(b"followed", code=0)
        runner = persist.PersistedRunner(ep)
        out = bytearray()
        code = runner.stream(
            "tail -f log",
            out.extend,
            lambda data: None,
            stdin=None,
            close_stdin=False,
            timeout=5.0,
            idle_timeout=None,
        )
        assert (code, bytes(out)) == (0, b"followed")
        assert relay.refused == ["tail -f log"] and fake.ran == [("tail -f log", b"", 5.0)]


def test_errors_keep_their_kind(served: tuple[Endpoint, FakeConnection]) -> None:
    ep, fake = served
    fake.answers["slow"] = CommandTimeout("pve: command did not finish within 1 s")
    fake.answers["lost"] = ConnectError("pve: connection lost", hint="check the network")
    with pytest.raises(CommandTimeout, match="within 1 s"):
        run(ep, "slow", stdin=None, timeout=1.0)
    with pytest.raises(ConnectError) as caught:
        run(ep, "lost", stdin=None, timeout=1.0)
    assert caught.value.hint == "check the network"


def test_a_failed_connection_ends_the_server(
    served: tuple[Endpoint, FakeConnection],
) -> None:
    """Not every later command failing through a broken connection: this one fails as a
    dropped direct connection would, and the next ones find no server and connect by
    themselves."""
    ep, fake = served
    fake.answers["true"] = ConnectError("pve: connection to 10.0.0.5 was lost")
    with pytest.raises(ConnectError, match="was lost"):
        run(ep, "true", stdin=None, timeout=5.0)
    deadline = time.monotonic() + 5
    while run(ep, "true", stdin=None, timeout=5.0) is not None:
        assert time.monotonic() < deadline, "the server kept serving"
        time.sleep(0.1)


def test_no_server_means_no_answer(runtime: Path) -> None:
    assert run(endpoint(), "true", stdin=None, timeout=1.0) is None
    path = persist.socket_path(endpoint())
    assert path is not None
    dead = socket.socket(socket.AF_UNIX)
    dead.bind(str(path))  # a socket file nobody listens on: a killed server's
    dead.close()
    assert run(endpoint(), "true", stdin=None, timeout=1.0) is None


def test_server_answers_only_its_own_user() -> None:
    """The second lock after the 0700 directory: another uid that reaches the socket gets no
    answer and runs nothing."""
    ep = endpoint()
    open_dir = Path(tempfile.mkdtemp(prefix="lu-peer", dir="/tmp"))
    open_dir.chmod(0o755)  # reachable by anyone, unlike the runtime directory
    path = open_dir / "s.sock"
    fake = FakeConnection()
    server = fake_server(ep, path, fake)
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(path))
    path.chmod(0o777)
    listener.listen(8)
    thread = threading.Thread(target=server.serve, args=(listener,), daemon=True)
    thread.start()
    code = (
        "import json, os, socket, sys\n"
        "os.setgid(65534); os.setuid(65534)\n"
        "s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])\n"
        "try:\n"  # the server may close before the request is even written
        "    s.sendall(json.dumps({'id': 1, 'command': 'id', 'stdin': '', 'timeout': 5})"
        ".encode() + b'\\n')\n"
        "    print(repr(s.recv(100)))\n"
        "except (ConnectionResetError, BrokenPipeError):\n"
        "    print(repr(b''))\n"
    )
    try:
        result = subprocess.run(
            [sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=30
        )
        assert result.stdout.strip() == "b''", result.stderr  # closed, no answer
        assert fake.ran == []
    finally:
        server.stopping.set()
        thread.join(5)
        listener.close()
        shutil.rmtree(open_dir)


@pytest.mark.parametrize("acknowledged", [True, False])
def test_an_answer_that_breaks_off(runtime: Path, acknowledged: bool) -> None:
    """Taken (acknowledged) and then no answer: a connection error, as a dropped connection
    mid-command; closed before the acknowledgement: not run, so no answer (the caller then
    connects by itself)."""
    path = persist.socket_path(endpoint())
    assert path is not None
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(path))
    listener.listen(1)

    def take_and_hang_up() -> None:
        client, _ = listener.accept()
        client.recv(65536)
        if acknowledged:
            client.sendall(frames.encode(frames.Taken(1)))
        client.close()

    thread = threading.Thread(target=take_and_hang_up)
    thread.start()
    if acknowledged:
        with pytest.raises(ConnectError, match="broke off"):
            run(endpoint(), "true", stdin=None, timeout=2.0)
    else:
        assert run(endpoint(), "true", stdin=None, timeout=2.0) is None
    thread.join(5)
    listener.close()


def test_an_endpoint_round_trips_through_json() -> None:
    """The background process gets its endpoint as JSON (persist.start): equal after the
    round trip, different when anything that decides the connection changed."""
    via = endpoint(name="jump", hostname="10.0.0.1")
    ep = endpoint(via=via, identity_files=("/a", "/b"), proxy_command=None)
    back = persist.endpoint_from_doc(json.loads(json.dumps(persist.endpoint_doc(ep))))
    assert back == ep
    assert back != dataclasses.replace(ep, port=2222)
    assert back != dataclasses.replace(ep, via=dataclasses.replace(via, user="other"))


class Follower(FakeConnection):
    """A command that prints once and then waits, as `logs -f` does, until it is cut off."""

    def __init__(self) -> None:
        super().__init__()
        self.cut_off = threading.Event()
        self.streamed: tuple[bool, float | None] | None = None

    def stream(
        self,
        command: str,
        on_stdout: Callable[[bytes], None],
        on_stderr: Callable[[bytes], None],
        *,
        stdin: bytes | None,
        close_stdin: bool,
        timeout: float | None,
        idle_timeout: float | None,
        cancel: threading.Event,
    ) -> int:
        self.streamed = (close_stdin, idle_timeout)
        on_stdout(b"line 1\n")
        if cancel.wait(10):
            self.cut_off.set()
            raise ConnectError("pve: connection failed during a command: the client went away")
        return 0


def test_a_stream_is_cut_off_when_its_client_goes_away(runtime: Path) -> None:
    """Output arrives as it is written; the client's sink failing (a reader gone) closes its
    socket, and the server cuts the command off at once (and keeps serving)."""
    ep = endpoint()
    path = persist.socket_path(ep)
    assert path is not None
    fake = Follower()
    server = fake_server(ep, path, fake)
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(path))
    listener.listen(8)
    thread = threading.Thread(target=server.serve, args=(listener,), daemon=True)
    thread.start()
    got: list[bytes] = []

    def sink(data: bytes) -> None:
        got.append(data)
        raise BrokenPipeError("the reader went away")

    try:
        with pytest.raises(BrokenPipeError):
            persist.PersistedRunner(ep).stream(
                "follow",
                sink,
                got.append,
                stdin=b"{}",
                close_stdin=False,
                timeout=None,
                idle_timeout=30.0,
            )
        assert got == [b"line 1\n"]
        assert fake.cut_off.wait(5), "the command was not cut off"
        assert fake.streamed == (False, 30.0)
        assert not server.stopping.is_set()  # a client going away is not a broken connection
    finally:
        server.stopping.set()
        thread.join(5)
        listener.close()
        path.unlink()


def test_stdin_larger_than_a_frame_takes_a_channel_of_its_own(
    served: tuple[Endpoint, FakeConnection], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A push bigger than the server reads in one frame is not sent at all (not encoded, not
    refused half-way): the caller's own connection carries it."""
    ep, fake = served
    monkeypatch.setattr(frames, "MAX_FRAME", 64 * 1024 + 3000)
    fake.answers["push"] = ok()
    assert run(ep, "push", stdin=b"x" * 3000, timeout=5.0) is None
    assert run(ep, "push", stdin=b"x" * 1000, timeout=5.0) is not None
    assert [command for command, _, _ in fake.ran] == ["push"]


class Quiet(FakeConnection):
    """A command that prints nothing for a while, then ends."""

    def stream(
        self,
        command: str,
        on_stdout: Callable[[bytes], None],
        on_stderr: Callable[[bytes], None],
        *,
        stdin: bytes | None,
        close_stdin: bool,
        timeout: float | None,
        idle_timeout: float | None,
        cancel: threading.Event,
    ) -> int:
        if cancel.wait(1.2):
            raise ConnectError("pve: connection failed during a command: the client went away")
        on_stdout(b"done\n")
        return 4


def test_a_quiet_command_is_not_taken_for_a_gone_client(
    runtime: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Silence longer than the server's socket timeout (a deploy's stop waiting out its grace)
    is not the client going away."""
    monkeypatch.setattr(persistserver, "SEND_TIMEOUT", 0.3)
    ep = endpoint()
    path = persist.socket_path(ep)
    assert path is not None
    server = fake_server(ep, path, Quiet())
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(path))
    listener.listen(8)
    thread = threading.Thread(target=server.serve, args=(listener,), daemon=True)
    thread.start()
    try:
        result = run(ep, "quiet", stdin=None, timeout=10.0)
        assert result is not None and (result.exit_code, result.stdout) == (4, b"done\n")
    finally:
        server.stopping.set()
        thread.join(5)
        listener.close()
        path.unlink()


def test_closing_the_runner_ends_a_stream_waiting_in_another_thread(runtime: Path) -> None:
    """Ctrl-C on a fleet or a job's `logs -f` closes the connections while worker threads wait
    for output: each waiting stream ends at once (not when its run ends), and the server cuts
    its command off."""
    ep = endpoint()
    path = persist.socket_path(ep)
    assert path is not None
    fake = Follower()
    server = fake_server(ep, path, fake)
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(path))
    listener.listen(8)
    thread = threading.Thread(target=server.serve, args=(listener,), daemon=True)
    thread.start()
    runner = persist.PersistedRunner(ep)
    first_line = threading.Event()
    ended: list[BaseException | int] = []

    def follow() -> None:
        try:
            ended.append(
                runner.stream(
                    "follow",
                    lambda data: first_line.set(),
                    lambda data: None,
                    stdin=b"{}",
                    close_stdin=False,
                    timeout=None,
                    idle_timeout=None,
                )
            )
        except BaseException as exc:  # what the worker thread would see
            ended.append(exc)

    worker = threading.Thread(target=follow, daemon=True)
    try:
        worker.start()
        assert first_line.wait(5), "the stream never started"
        started = time.monotonic()
        runner.close()
        worker.join(5)
        assert not worker.is_alive(), "the stream went on after close()"
        assert time.monotonic() - started < 2
        assert len(ended) == 1 and isinstance(ended[0], ConnectError), ended
        assert fake.cut_off.wait(5), "the server did not cut the command off"
    finally:
        server.stopping.set()
        thread.join(5)
        listener.close()
        path.unlink()


def test_a_closed_runner_sends_no_command(served: tuple[Endpoint, FakeConnection]) -> None:
    """A thread whose command was on its way when the runner closed: the command never reaches
    the server (nothing would end it: it would follow a log until the run ends)."""
    ep, fake = served
    fake.answers["follow"] = ok()
    runner = persist.PersistedRunner(ep)
    runner.close()
    with pytest.raises(ConnectError, match="the connection was closed"):
        runner.run("follow", stdin=None, timeout=5.0)
    assert fake.ran == []
