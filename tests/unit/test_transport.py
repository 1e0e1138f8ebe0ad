"""The transport's one frame format (frames.py), its relay host program, and the choice of
runner (connection.py), without a host."""

from __future__ import annotations

import ast
import dataclasses
import json
import queue
import threading
from pathlib import Path

import pytest

from launcher.core.errors import ConnectError
from launcher.transport import frames, relay, relayhost
from launcher.transport import ssh as ssh_module
from launcher.transport.connection import Connection
from launcher.transport.endpoint import Endpoint
from launcher.transport.persist import PersistedRunner
from launcher.transport.runner import Unavailable
from launcher.transport.ssh import SSHConnection

ALL = [
    frames.Run(7, "pct exec 1 -- true", b"\x00\xff", 5.0),
    frames.Run(8, "x", b"", 1.5, idle_timeout=2.0, close_stdin=False),
    frames.Cancel(7),
    frames.Stop(),
    frames.Hello(frames.VERSION),
    frames.Taken(7),
    frames.Output(7, 1, b"\x00out"),
    frames.Output(7, 2, b"err"),
    frames.Exit(7, 3),
    frames.Failed(7, "CommandTimeout", "did not finish", None),
    frames.Failed(7, "ConnectError", "lost", "check the network"),
]


@pytest.mark.parametrize("frame", ALL, ids=lambda f: type(f).__name__)
def test_every_frame_round_trips(frame: frames.Frame) -> None:
    line = frames.encode(frame)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert frames.decode(line.rstrip(b"\n")) == frame


@pytest.mark.parametrize(
    ("line", "says"),
    [
        (b"not json", "not JSON"),
        (b"[1, 2]", "not a JSON object"),
        (b"{}", "not a frame"),
        (b'{"id": 1, "exit": 0, "fd": 1}', "not a frame"),  # two kinds at once
        (b'{"id": "1", "exit": 0}', "'id' is str"),
        (b'{"id": 1, "exit": true}', "'exit' is True"),
        (b'{"id": 1, "fd": 3, "data": ""}', "fd 3"),
        (b'{"id": 1, "fd": 1, "data": "%%%"}', "not base64"),
        (b'{"id": 1, "fd": 1}', "without 'data'"),
        (b'{"id": 1, "exit": 0, "extra": 1}', "unknown keys ['extra']"),
        (b'{"id": 1, "command": "x", "stdin": "", "timeout": "5"}', "'timeout' is str"),
    ],
)
def test_a_malformed_frame_is_a_clear_error(line: bytes, says: str) -> None:
    with pytest.raises(frames.FrameError, match=says.replace("[", r"\[").replace("]", r"\]")):
        frames.decode(line)


def test_lines_split_frames_and_bound_them() -> None:
    chunks = [frames.encode(frames.Exit(1, 0))[:5], frames.encode(frames.Exit(1, 0))[5:], b""]
    lines = frames.Lines(lambda n: chunks.pop(0))
    assert lines.next() == frames.Exit(1, 0)
    assert lines.next() is None
    endless = frames.Lines(lambda n: b"x" * 100, limit=1000)
    with pytest.raises(frames.FrameError, match="longer than 1000"):
        endless.next()


def test_the_relay_host_program_speaks_the_same_frames() -> None:
    """relayhost.py runs on the host's python3: the same version, Python 3.5 syntax, only the
    standard library; and what the client sends it is what it reads."""
    assert relayhost.VERSION == frames.VERSION
    source = Path(relayhost.__file__).read_text()
    assert source == relay.SOURCE
    ast.parse(source, feature_version=(3, 5))
    imported = {
        alias.name
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Import)
        for alias in node.names
    }
    assert all(not name.startswith("launcher") for name in imported)
    assert not any(isinstance(n, ast.ImportFrom) for n in ast.walk(ast.parse(source)))
    doc = json.loads(frames.encode(frames.Run(3, "true", b"in", 9.0)))
    assert {"id", "command", "stdin", "timeout"} == set(doc)  # what relayhost.run reads


def endpoint(**overrides: object) -> Endpoint:
    values: dict[str, object] = {
        "name": "pve",
        "hostname": "10.0.0.5",
        "port": 22,
        "user": "root",
        "identity_files": (),
        "known_hosts": Path("/kh"),
        "accept_new": False,
        "jump": None,
        "connect_timeout": 5.0,
        "command_timeout": 60.0,
    }
    values.update(overrides)
    return Endpoint(**values)  # type: ignore[arg-type]


def test_one_place_chooses_the_runner() -> None:
    """Persisted first (while this process holds no connection of its own), then the relay
    (several targets on the host), then a channel of its own, which takes every command."""
    plain = Connection(endpoint())
    assert [type(r) for r in plain.runners()] == [SSHConnection]
    plain.use_relay()
    assert [type(r) for r in plain.runners()] == [relay.Relay, SSHConnection]
    persisted = Connection(dataclasses.replace(endpoint(), control_persist=60.0))
    persisted.use_relay()  # not for a persisted connection: its process carries them
    assert [type(r) for r in persisted.runners()] == [PersistedRunner, SSHConnection]


def test_a_closed_connection_runs_nothing_and_does_not_connect_again() -> None:
    """Ctrl-C on a fleet or a job's `logs -f` closes the connections under worker threads; a
    thread between two commands must end, not open a connection of its own (the address is
    10.0.0.5: a connect attempt would fail here with another error, after its timeout)."""
    conn = Connection(dataclasses.replace(endpoint(), control_persist=60.0))
    conn.close()
    with pytest.raises(ConnectError, match="the connection was closed"):
        conn.run("true", timeout=1.0)
    with pytest.raises(ConnectError, match="the connection was closed"):
        conn.stream("true", lambda data: None, timeout=1.0)
    assert not conn.ssh.connected


class FakeChannel:
    """A relay's channel: the hello, then for each Run frame sent, the line `reply` gives."""

    def __init__(self, reply: bytes | None) -> None:
        self.reply = reply  # None: a quiet command, which sends nothing back
        self.inbox: queue.Queue[bytes] = queue.Queue()
        self.inbox.put(frames.encode(frames.Hello(frames.VERSION)))
        self.closed = False
        self.sent: list[bytes] = []

    def sendall(self, data: bytes) -> None:
        self.sent.append(data)
        if data.startswith(b"{") and b'"command"' in data and self.reply is not None:
            self.inbox.put(self.reply)

    def recv(self, size: int) -> bytes:
        return self.inbox.get(timeout=5)

    def settimeout(self, seconds: float | None) -> None:
        pass


class FakeSSH:
    """What the relay needs from the SSH connection: one channel, opened once."""

    def __init__(self, channel: FakeChannel) -> None:
        self.endpoint = endpoint()
        self.channel = channel
        self.opened = 0

    def open_command(self, command: str, timeout: float) -> FakeChannel:
        assert "launcher_relay" in command
        self.opened += 1
        return self.channel

    def close_command(self, channel: FakeChannel) -> None:
        channel.closed = True


@pytest.mark.parametrize(
    ("reply", "says"),
    [
        (b'{"id": 1, "fd": 9, "data": ""}\n', "output frame for fd 9"),
        (b"garbage\n", "not JSON"),
        (b'{"hello": 2}\n', "the relay sent Hello"),
    ],
)
def test_a_malformed_frame_from_the_relay_fails_its_calls_clearly(reply: bytes, says: str) -> None:
    """Never a KeyError in a reader thread and a call left waiting: the calls the relay carried
    fail as on a dropped channel, saying what was wrong, and the channel is closed."""
    channel = FakeChannel(reply)
    ssh = FakeSSH(channel)
    carrier = relay.Relay(ssh)  # type: ignore[arg-type]
    with pytest.raises(ConnectError, match=says):
        carrier.run("pct exec 1 -- true", stdin=None, timeout=5.0)
    assert channel.closed and ssh.opened == 1


def test_a_relayed_command_whose_client_went_away_is_given_up() -> None:
    """A persisted connection's command through its relay: its client going away (`cancel`)
    ends a quiet command (not at its 60 s deadline), as it ends one on a channel, and the relay
    is told to give it up (a Cancel frame), not left running it for nobody."""
    channel = FakeChannel(None)
    carrier = relay.Relay(FakeSSH(channel))  # type: ignore[arg-type]
    gone = threading.Event()
    threading.Timer(0.2, gone.set).start()
    with pytest.raises(ConnectError, match="the client went away"):
        carrier.stream(
            "pct exec 1 -- sleep 60",
            lambda data: None,
            lambda data: None,
            stdin=None,
            timeout=60.0,
            cancel=gone,
        )
    run_id = frames.decode(channel.sent[1].rstrip(b"\n"))
    assert isinstance(run_id, frames.Run)
    assert frames.decode(channel.sent[-1].rstrip(b"\n")) == frames.Cancel(run_id.id)


class BrokenChannel(FakeChannel):
    """A relay that ended (or a channel that broke) before its reader noticed: sending fails."""

    def sendall(self, data: bytes) -> None:
        if b'"command"' in data:
            raise OSError("Socket is closed")
        super().sendall(data)


def test_a_command_that_never_reached_the_relay_goes_to_the_next_runner() -> None:
    """A Run frame that could not be sent ran nothing (the relay runs only whole frames): the
    command is not failed as if the link had dropped under it, but handed on (Unavailable)."""
    carrier = relay.Relay(FakeSSH(BrokenChannel(None)))  # type: ignore[arg-type]
    with pytest.raises(Unavailable):
        carrier.run("pct exec 1 -- true", stdin=None, timeout=5.0)


def test_a_big_upload_gets_a_channel_of_its_own() -> None:
    """A project's files on stdin would hold the relay's one channel up for every other command
    while they travel: the relay hands such a command on before starting or sending anything."""
    ssh = FakeSSH(FakeChannel(b""))
    carrier = relay.Relay(ssh)  # type: ignore[arg-type]
    with pytest.raises(Unavailable):
        carrier.run("pct exec 1 -- true", stdin=b"x" * (relay.MAX_STDIN + 1), timeout=5.0)
    assert ssh.opened == 0 and ssh.channel.sent == []


class RefusingTransport:
    """sshd's side of session opens: refuses the first `refusals` with `code`, then opens.
    Anything else launcher might call on it fails the test."""

    def __init__(self, refusals: int, code: int) -> None:
        self.refusals, self.code, self.opened = refusals, code, 0

    def is_active(self) -> bool:
        return True

    def open_session(self, timeout: float) -> str:
        import paramiko

        self.opened += 1
        if self.opened <= self.refusals and self.code == 0:
            # paramiko, when another open refused at the same moment took the saved failure
            raise paramiko.SSHException("Unable to open channel.")
        if self.opened <= self.refusals:
            raise paramiko.ChannelException(self.code, "refused")
        return "channel"


class FakeClient:
    def __init__(self, transport: RefusingTransport) -> None:
        self.transport = transport

    def get_transport(self) -> RefusingTransport:
        return self.transport


@pytest.mark.parametrize("code", [1, 2, 0], ids=["prohibited", "connect-failed", "unexplained"])
def test_a_session_refused_just_after_a_close_is_asked_for_again(
    monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    """sshd counts a session it closed against MaxSessions until its loop collects it, which
    can come after our next open: such a refusal is retried for a moment, never forever."""
    conn = SSHConnection(endpoint())
    transport = RefusingTransport(refusals=3, code=code)
    monkeypatch.setattr(conn, "_connected", lambda *a: FakeClient(transport))
    assert conn._open_channel() == "channel"
    assert transport.opened == 4

    monkeypatch.setattr(ssh_module, "SESSION_REFUSED_RETRY", 0.3)
    stuck = RefusingTransport(refusals=10**6, code=code)
    monkeypatch.setattr(conn, "_connected", lambda *a: FakeClient(stuck))
    with pytest.raises(ConnectError, match="cannot open a session"):
        conn._open_channel()
    assert 2 <= stuck.opened <= 10  # asked again with growing pauses, within the 0.3 s


def test_a_session_refused_for_another_reason_is_not_asked_for_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    conn = SSHConnection(endpoint())
    transport = RefusingTransport(refusals=1, code=3)  # unknown channel type: for good
    monkeypatch.setattr(conn, "_connected", lambda *a: FakeClient(transport))
    with pytest.raises(ConnectError, match="cannot open a session"):
        conn._open_channel()
    assert transport.opened == 1
