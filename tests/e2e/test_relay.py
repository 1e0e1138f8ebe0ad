"""The relay (one channel for every command of a fleet on one host) against the sandbox's sshd.

What a relayed command returns must be exactly what the same command returns on a channel of
its own; deadlines, cancellation, a relay killed on the host and a host that cannot run it."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from launcher.container.pct import Container
from launcher.core.errors import CommandTimeout, ConnectError
from launcher.sandbox import Sandbox, SandboxInfo
from launcher.transport import relay
from launcher.transport.connection import Connection
from launcher.transport.runner import STATS
from tests.e2e.project import Project
from tests.e2e.test_remote import connect

pytestmark = pytest.mark.e2e

HOSTILE = ["it's", 'say "hi"', "$(touch /tmp/pwned)", "a;b", "`id`", "new\nline", " ", "*", "\\"]


@pytest.fixture
def relayed(sandbox: tuple[Sandbox, SandboxInfo]) -> Iterator[Connection]:
    conn = connect(sandbox[1])
    conn.use_relay()
    yield conn
    conn.close()


@pytest.fixture
def direct(sandbox: tuple[Sandbox, SandboxInfo]) -> Iterator[Connection]:
    conn = connect(sandbox[1])
    yield conn
    conn.close()


def outcome(conn: Connection, argv: list[str], stdin: bytes | None = None) -> tuple[Any, ...]:
    result = Container(conn, 200, label="sandbox").exec(argv, stdin=stdin)
    return result.exit_code, result.stdout, result.stderr


def test_relayed_commands_return_what_direct_ones_do(
    relayed: Connection, direct: Connection
) -> None:
    binary = bytes(range(256)) * 64
    cases: list[tuple[list[str], bytes | None]] = [
        (["sh", "-c", "echo out; echo err >&2; exit 7"], None),
        (["printf", r"%s\0", *HOSTILE], None),
        (["cat"], binary),  # stdin and stdout byte for byte
        (["sh", "-c", "cat >&2"], binary),
        (["sh", "-c", "head -c 2000000 /dev/zero"], None),
        (["true"], b""),
        (["false"], None),
    ]
    before = (STATS.commands, STATS.relayed)
    for argv, stdin in cases:
        assert outcome(relayed, argv, stdin) == outcome(direct, argv, stdin), argv
    # The relayed ones shared one channel (the relay's); the direct ones had one each.
    assert STATS.relayed - before[1] == len(cases)
    assert STATS.commands - before[0] == len(cases) + 1
    assert not relayed._relay.unavailable  # type: ignore[union-attr]


def test_concurrent_commands_each_get_their_own_output(relayed: Connection) -> None:
    results: dict[int, tuple[Any, ...]] = {}

    def one(n: int) -> None:
        script = f"printf 'out-{n}-%s' $(seq 1 {n}); sleep 0.{n % 5}; echo err-{n} >&2; exit {n}"
        results[n] = outcome(relayed, ["sh", "-c", script])

    threads = [threading.Thread(target=one, args=(n,)) for n in range(1, 17)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    for n in range(1, 17):
        expected = "".join(f"out-{n}-{i}" for i in range(1, n + 1)).encode()
        assert results[n] == (n, expected, f"err-{n}\n".encode())


def test_a_command_given_up_is_cut_off_as_a_dropped_channel_would_cut_it(
    relayed: Connection, direct: Connection, project: Project
) -> None:
    """Its output pipe closes (a writer dies of SIGPIPE, as under sshd), it is not killed: a
    command that outlives its client on purpose (a deploy transaction) still completes."""
    marker = f"/tmp/relay-outlived-its-client-{uuid.uuid4().hex}"
    try:
        started = time.monotonic()
        with pytest.raises(CommandTimeout, match="did not finish within 1 s"):
            relayed.run("while :; do echo tick 47.5; sleep 0.2; done", timeout=1)
        with pytest.raises(CommandTimeout):
            outlive = f"trap '' PIPE HUP; echo go; sleep 2.5; touch {marker}; echo done"
            relayed.run(outlive, timeout=1)
        assert time.monotonic() - started < 8
        project.wait_for(
            lambda: "tick 47.5" not in host_processes(direct), timeout=10, what="the writer ended"
        )
        project.wait_for(
            lambda: direct.run(f"test -e {marker}", timeout=10).ok, timeout=10, what="the marker"
        )
        assert relayed.run("echo still here", timeout=10).out == "still here\n"
    finally:  # the marker is on the sandbox host, this machine: the test leaves nothing there
        Path(marker).unlink(missing_ok=True)


def test_idle_timeout_and_output_as_it_comes(relayed: Connection) -> None:
    seen: list[tuple[float, bytes]] = []
    started = time.monotonic()
    code = relayed.stream(
        "echo first; sleep 1.5; echo second",
        lambda data: seen.append((time.monotonic() - started, data)),
        timeout=20,
    )
    assert code == 0 and b"".join(d for _, d in seen) == b"first\nsecond\n"
    assert seen[0][0] < seen[-1][0] - 1.0  # the first line came before the command ended
    with pytest.raises(CommandTimeout, match="no output for 1 s"):
        relayed.stream("echo a; sleep 30", lambda data: None, timeout=20, idle_timeout=1)


def test_a_sink_that_fails_cuts_the_command_off(relayed: Connection, direct: Connection) -> None:
    class Stop(Exception):
        pass

    def sink(data: bytes) -> None:
        raise Stop()

    with pytest.raises(Stop):
        relayed.stream("while :; do echo tick 48.5; sleep 0.2; done", sink, timeout=60)
    deadline = time.monotonic() + 10
    while "tick 48.5" in host_processes(direct) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert "tick 48.5" not in host_processes(direct)


def test_a_relay_killed_on_the_host_fails_its_calls_and_the_next_starts_anew(
    relayed: Connection, direct: Connection
) -> None:
    assert relayed.run("echo up", timeout=10).out == "up\n"
    failures: list[BaseException] = []

    def long() -> None:
        try:
            relayed.run("sleep 49.5", timeout=60)
        except BaseException as exc:  # what it raised is the assertion
            failures.append(exc)

    thread = threading.Thread(target=long)
    thread.start()
    deadline = time.monotonic() + 10  # the command is running on the host, through the relay
    while "sleep 49.5" not in host_processes(direct) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "sleep 49.5" in host_processes(direct)
    # This relay only (the one running the sleep), not every relay on the machine: another
    # sandbox's tests may be using theirs.
    assert direct.run(KILL_RELAY_OF.format(pattern="[s]leep 49[.]5"), timeout=10).ok
    thread.join(15)
    assert not thread.is_alive()
    assert len(failures) == 1 and isinstance(failures[0], ConnectError), failures
    assert relayed.run("echo again", timeout=10).out == "again\n"


def test_a_host_that_cannot_run_the_relay_gets_channels_of_its_own(
    relayed: Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(relay, "COMMAND", "echo no python3 here >&2; exit 127")
    before = STATS.relayed
    assert outcome(relayed, ["sh", "-c", "echo fine; exit 3"]) == (3, b"fine\n", b"")
    assert outcome(relayed, ["true"]) == (0, b"", b"")
    assert relayed._relay.unavailable and STATS.relayed == before  # type: ignore[union-attr]


# Kill the launcher_relay process that is an ancestor of the process matching {pattern}.
KILL_RELAY_OF = (
    "p=$(pgrep -f '{pattern}' | head -n 1); "
    'while [ -n "$p" ] && [ "$p" != 1 ]; do '
    "if tr '\\0' ' ' < /proc/$p/cmdline | grep -q '[l]auncher_relay'; "
    "then kill -KILL $p; exit; fi; "
    "p=$(cut -d' ' -f4 /proc/$p/stat); done; exit 1"
)


def host_processes(conn: Connection) -> str:
    return conn.run("ps -eo args", timeout=10).out
