"""The remote layer against the sandbox's real sshd: host keys, deadlines, streams, quoting."""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from launcher.config.models import HostSpec
from launcher.container.pct import Container
from launcher.core.errors import CommandTimeout, ConnectError, ContainerError, HostKeyError
from launcher.sandbox import Sandbox, SandboxInfo
from launcher.transport import ssh
from launcher.transport.connection import Connection
from launcher.transport.resolve import resolve_endpoint
from launcher.transport.runner import STATS
from tests.e2e.project import local_processes

pytestmark = pytest.mark.e2e

ARG = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=30)


def host_spec(info: SandboxInfo, **overrides: object) -> HostSpec:
    values: dict[str, object] = {
        "address": info.address,
        "port": info.port,
        "identity_file": str(info.identity_file),
        "known_hosts": str(info.known_hosts),
        "connect_timeout": 5,
    }
    values.update(overrides)
    return HostSpec.model_validate(values)


def connect(info: SandboxInfo, **overrides: object) -> Connection:
    return Connection(resolve_endpoint("sandbox", host_spec(info, **overrides)))


@pytest.fixture(scope="module")
def conn(sandbox: tuple[Sandbox, SandboxInfo]) -> Connection:
    connection = connect(sandbox[1])
    yield connection  # type: ignore[misc]
    connection.close()


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(ARG, min_size=1, max_size=5))
def test_any_argv_reaches_the_container_unchanged(conn: Connection, argv: list[str]) -> None:
    container = Container(conn, 200, label="sandbox")
    result = container.exec(["printf", r"%s\0", *argv])
    assert result.exit_code == 0, result.err
    assert result.stdout.decode("utf-8", "surrogateescape").split("\0")[:-1] == argv


def test_exit_code_and_streams(conn: Connection) -> None:
    result = Container(conn, 200, label="sandbox").exec(
        ["sh", "-c", "echo out; echo err >&2; exit 7"]
    )
    assert (result.exit_code, result.out, result.err) == (7, "out\n", "err\n")


def test_large_output_on_both_streams_does_not_hang(conn: Connection) -> None:
    script = (
        "head -c 3000000 /dev/zero | tr '\\0' o & head -c 3000000 /dev/zero | tr '\\0' e >&2; wait"
    )
    for _ in range(5):  # the end of the two streams races with the close: try it a few times
        result = conn.run(f"sh -c {script!r}", timeout=60)
        assert result.ok
        assert len(result.stdout) == 3_000_000 and len(result.stderr) == 3_000_000


def test_one_connection_for_many_commands(sandbox: tuple[Sandbox, SandboxInfo]) -> None:
    before = STATS.connects
    with connect(sandbox[1]) as connection:
        for _ in range(5):
            assert connection.run("true").ok
    assert STATS.connects - before == 1


def test_unknown_host_key_is_refused_with_advice(
    sandbox: tuple[Sandbox, SandboxInfo], tmp_path: Path
) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    with (
        connect(sandbox[1], known_hosts=str(empty)) as connection,
        pytest.raises(HostKeyError) as error,
    ):
        connection.run("true")
    assert "is not in" in error.value.message
    assert error.value.hint and "ssh-keyscan -p" in error.value.hint
    assert empty.read_text() == ""


def test_accept_new_records_the_key(sandbox: tuple[Sandbox, SandboxInfo], tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    with connect(sandbox[1], known_hosts=str(known), host_key_policy="accept-new") as connection:
        assert connection.run("true").ok
    assert f"[127.0.0.1]:{sandbox[1].port} ssh-ed25519 " in known.read_text()
    # Strict from now on: the recorded key is what is checked.
    with connect(sandbox[1], known_hosts=str(known)) as connection:
        assert connection.run("true").ok


def test_changed_host_key_is_refused_even_with_accept_new(
    sandbox: tuple[Sandbox, SandboxInfo], tmp_path: Path
) -> None:
    info = sandbox[1]
    key = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    other_line = " ".join(key.with_suffix(".pub").read_text().split()[:2])
    known = tmp_path / "known_hosts"
    known.write_text(f"[127.0.0.1]:{info.port} {other_line}\n")
    with (
        connect(info, known_hosts=str(known), host_key_policy="accept-new") as connection,
        pytest.raises(HostKeyError, match="CHANGED"),
    ):
        connection.run("true")


def test_refused_port_fails_after_bounded_retries(sandbox: tuple[Sandbox, SandboxInfo]) -> None:
    started = time.monotonic()
    with (
        connect(sandbox[1], port=1, connect_timeout=1) as connection,
        pytest.raises(ConnectError, match="cannot connect"),
    ):
        connection.run("true")
    assert time.monotonic() - started < 5


def test_stopped_container_is_a_container_error(sandbox: tuple[Sandbox, SandboxInfo]) -> None:
    sb, info = sandbox
    sb.stop_container(201)
    try:
        with (
            connect(info) as connection,
            pytest.raises(ContainerError, match="container 201 not running"),
        ):
            Container(connection, 201, label="sandbox").exec(["true"])
    finally:
        sb.start_container(201)


def test_dropped_link_reconnects_on_next_command(sandbox: tuple[Sandbox, SandboxInfo]) -> None:
    before = STATS.connects
    with connect(sandbox[1]) as connection:
        assert connection.run("true").ok
        # Cut the TCP connection under the SSH session, as a network drop would.
        transport = connection.ssh._connected().get_transport()
        assert transport is not None
        transport.sock.close()  # type: ignore[union-attr]
        transport.join(5)
        assert connection.run("echo back").out == "back\n"
    assert STATS.connects - before == 2


def test_the_connection_is_fabrics_with_launchers_host_key_policy(conn: Connection) -> None:
    import fabric
    import paramiko

    assert conn.run("true").ok
    assert isinstance(conn.fabric, fabric.Connection)
    # Fabric's own default (AutoAddPolicy) would accept any unknown key: never in place.
    policy = conn.fabric.client._policy
    assert not isinstance(policy, paramiko.AutoAddPolicy | paramiko.WarningPolicy)
    # One connection: launcher's channels and Fabric's API share the transport.
    assert conn.fabric.transport is conn.ssh._connected().get_transport()
    assert conn.fabric.run("echo via fabric", hide=True, in_stream=False).stdout == "via fabric\n"


def test_stream_output_deadlines_and_a_failing_reader(conn: Connection) -> None:
    out: list[bytes] = []
    err: list[bytes] = []
    code = conn.stream("echo a; echo b >&2; exit 3", out.append, on_stderr=err.append)
    assert (code, b"".join(out), b"".join(err)) == (3, b"a\n", b"b\n")

    started = time.monotonic()
    with pytest.raises(CommandTimeout, match="no output for 1 s"):
        conn.stream("echo x; sleep 30", out.append, idle_timeout=1)
    with pytest.raises(CommandTimeout, match="did not finish within 1 s"):
        conn.stream("while :; do echo tick; sleep 0.2; done", out.append, timeout=1, idle_timeout=5)
    assert time.monotonic() - started < 5

    class ReaderGone(Exception):
        pass

    def gone(data: bytes) -> None:
        raise ReaderGone()

    # The reader's own error, not a connection error.
    with pytest.raises(ReaderGone):
        conn.stream("echo x", gone)
    assert conn.run("echo still usable").out == "still usable\n"


def _overlap(conn: Connection, commands: int, hold: float = 0.4) -> tuple[int, list[BaseException]]:
    """Run `commands` host commands at once on `conn`, each `hold` s long: (the most that ran
    at the same time on the host, the errors)."""
    spans: list[tuple[float, float]] = []
    errors: list[BaseException] = []

    def one() -> None:
        try:
            result = conn.run(f"date +%s.%N; sleep {hold}; date +%s.%N", timeout=60)
            start, end = (float(x) for x in result.stdout.split())
            spans.append((start, end))
        except Exception as exc:  # collected for the assertion
            errors.append(exc)

    threads = [threading.Thread(target=one) for _ in range(commands)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    most = max((sum(1 for s, e in spans if s <= at < e) for at, _ in spans), default=0)
    return most, errors


def test_sshd_refuses_sessions_beyond_its_max_sessions(
    sandbox: tuple[Sandbox, SandboxInfo],
) -> None:
    """The control for the next test: the sandbox's sshd has OpenSSH's default MaxSessions 10,
    and a connection that opens more sessions at once than that has commands refused (once
    the moment a refused open is asked for again has passed: the sessions are held longer)."""
    with connect(sandbox[1], max_sessions=30) as many:
        _, errors = _overlap(many, 24, hold=ssh.SESSION_REFUSED_RETRY + 2)
    assert errors and all("cannot open a session" in str(e) for e in errors), errors


@pytest.mark.parametrize("max_sessions", [8, 2])
def test_commands_beyond_max_sessions_wait_for_a_slot(
    sandbox: tuple[Sandbox, SandboxInfo], max_sessions: int
) -> None:
    """A fleet bigger than sshd's MaxSessions on one host: every command runs, at most
    `max_sessions` (default 8) at a time on the one connection."""
    kwargs = {} if max_sessions == 8 else {"max_sessions": max_sessions}
    with connect(sandbox[1], **kwargs) as conn:
        most, errors = _overlap(conn, 24 if max_sessions == 8 else 6)
    assert errors == []
    assert 1 <= most <= max_sessions


def test_waiting_for_a_session_counts_against_the_command_deadline(
    sandbox: tuple[Sandbox, SandboxInfo],
) -> None:
    with connect(sandbox[1], max_sessions=1) as conn:
        holder = threading.Thread(target=lambda: conn.run("sleep 3.25", timeout=30))
        holder.start()
        # The one session is taken: its command runs (for 3.25 s) on the host, this machine.
        deadline = time.monotonic() + 10
        while not running(b"sleep\x003.25\x00") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert running(b"sleep\x003.25\x00")
        with pytest.raises(CommandTimeout, match="no free SSH session within 1 s"):
            conn.run("true", timeout=1)
        holder.join()
        assert conn.run("true", timeout=5).exit_code == 0  # the slot came back


def running(cmdline: bytes) -> bool:
    """Whether a process on this machine (the sandbox's host) has this exact command line."""
    return any(found == cmdline for _, found, _ in local_processes())
