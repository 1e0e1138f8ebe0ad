"""status's early poll from a child process (prefetch._EarlyPoll), with the child's work
replaced: what it hands back is used only for exactly its request and endpoint, its failure is
raised as it came, and a child that dies, answers nonsense or hangs costs nothing but the
poll the command then sends itself. The real child, against the sandbox, is in
tests/e2e/test_early_start.py."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import time
from collections.abc import Callable
from typing import Any

import pytest

from launcher import persist, prefetch
from launcher.errors import AuthError
from launcher.remote import CommandResult, Endpoint
from tests.unit.test_persist import endpoint, poll_line

COMMAND = "pct exec 200 -- agent"
REQUEST = poll_line(session="s")


@pytest.fixture(autouse=True)
def fresh_prefetch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(prefetch, "_early_poll", None)
    monkeypatch.setattr(prefetch, "_adopted", None)


class Conn:
    """What take_direct asks of a connection: its endpoint, nothing else."""

    def __init__(self, ep: Endpoint) -> None:
        self.endpoint = ep


def start(monkeypatch: pytest.MonkeyPatch, child: Callable[[int], None]) -> prefetch._EarlyPoll:
    """An early poll whose child runs `child(write_end)` and then ends, whatever happens."""

    def in_child(write_end: int, *args: Any) -> None:
        try:
            child(write_end)
        finally:
            os._exit(0)

    monkeypatch.setattr(prefetch, "_poll_for_parent", in_child)
    poll = prefetch._EarlyPoll(persist.endpoint_doc(endpoint()), COMMAND, REQUEST, 9.0)
    monkeypatch.setattr(prefetch, "_early_poll", poll)
    return poll


def writes(answer: dict[str, Any] | bytes) -> Callable[[int], None]:
    data = answer if isinstance(answer, bytes) else json.dumps(answer).encode()

    def child(write_end: int) -> None:
        with open(write_end, "wb") as pipe:
            pipe.write(data)

    return child


def reaped(pid: int) -> bool:
    """The child was waited for (no zombie left behind)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return False


def test_the_answer_is_used_once_for_exactly_its_request(monkeypatch: pytest.MonkeyPatch) -> None:
    big = os.urandom(3 * 1024 * 1024)  # more than a pipe holds: read while it writes
    result = CommandResult(COMMAND, 1, big, b"warn", 0.2)
    poll = start(monkeypatch, writes(persist.result_answer(result)))
    conn = Conn(endpoint())
    assert prefetch.polling()
    # Another command, or another request, on this connection: not its answer; still pending.
    assert prefetch.take_direct(conn, "pct exec 200 -- other", REQUEST, 9.0) is None
    assert prefetch.take_direct(conn, COMMAND, poll_line(session="t"), 9.0) is None
    assert prefetch.polling()
    got = prefetch.take_direct(conn, COMMAND, REQUEST, 9.0)
    assert got is not None
    assert (got.exit_code, got.stdout, got.stderr, got.command) == (1, big, b"warn", COMMAND)
    assert not prefetch.polling()
    assert prefetch.take_direct(conn, COMMAND, REQUEST, 9.0) is None
    assert reaped(poll.pid)


def test_another_endpoint_never_gets_the_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    poll = start(monkeypatch, writes(persist.result_answer(CommandResult("x", 0, b"a", b"", 0))))
    other = Conn(dataclasses.replace(endpoint(), port=2222))
    assert prefetch.take_direct(other, COMMAND, REQUEST, 9.0) is None
    assert not prefetch.polling()  # dropped: its pipe closed, the child's write fails
    with pytest.raises(OSError):
        os.fstat(poll.read_end)


def test_a_failure_is_raised_as_it_came(monkeypatch: pytest.MonkeyPatch) -> None:
    error = AuthError("pve: the key /keys/id was refused", hint="add it to authorized_keys")
    start(monkeypatch, writes(persist.error_answer(error)))
    with pytest.raises(AuthError) as raised:
        prefetch.take_direct(Conn(endpoint()), COMMAND, REQUEST, 9.0)
    assert (raised.value.message, raised.value.hint) == (error.message, error.hint)


@pytest.mark.parametrize(
    "child",
    [
        writes(b""),  # died before it answered (kill -9, say)
        writes(b'{"ok": true, "exit": 0, "out": "tr'),  # died while it answered
        writes(b"[1, 2]"),  # not an answer
        writes(b"\xff\xfe garbage"),
    ],
)
def test_a_child_without_an_answer_leaves_the_poll_to_the_command(
    monkeypatch: pytest.MonkeyPatch, child: Callable[[int], None]
) -> None:
    poll = start(monkeypatch, child)
    assert prefetch.take_direct(Conn(endpoint()), COMMAND, REQUEST, 9.0) is None
    assert reaped(poll.pid)


def test_a_child_that_hangs_is_killed_past_every_deadline_of_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(persist, "ANSWER_MARGIN", 0.0)
    ep = dataclasses.replace(endpoint(), connect_timeout=0.2)
    poll = start(monkeypatch, lambda _: time.sleep(60))
    monkeypatch.setattr(poll, "doc", persist.endpoint_doc(ep))
    monkeypatch.setattr(poll, "sent", (COMMAND, REQUEST, 0.1))
    assert prefetch.take_direct(Conn(ep), COMMAND, REQUEST, 0.1) is None
    assert reaped(poll.pid)


def test_an_early_socket_carries_the_first_attempt_of_a_direct_endpoint_only() -> None:
    """prefetch starts the TCP connection before the SSH libraries load; the connection's first
    attempt runs over it once it completes, a later one (a retry) opens its own, and an
    endpoint reached through a jump host or a ProxyCommand never takes it (it is closed)."""
    from launcher.remote import Connection

    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        doc = persist.endpoint_doc(dataclasses.replace(endpoint(), hostname="127.0.0.1", port=port))
        sock = prefetch.early_socket(doc)
        assert sock is not None
        conn = Connection(persist.endpoint_from_doc(doc))
        conn.give_socket(sock)
        deadline = time.monotonic() + 5
        assert conn._socket(deadline) is sock
        assert sock.getblocking() and sock.getpeername() == ("127.0.0.1", port)
        retry = conn._socket(deadline)
        assert retry is not sock and retry.getpeername() == ("127.0.0.1", port)
        retry.close()
        sock.close()

        for other in (
            {**doc, "proxy_command": "nc %h %p"},
            {**doc, "via": persist.endpoint_doc(endpoint(name="jump"))},
        ):
            assert prefetch.early_socket(other) is None
            indirect = Connection(persist.endpoint_from_doc(other))
            given = socket.create_connection(("127.0.0.1", port))
            indirect.give_socket(given)
            assert given.fileno() == -1  # closed, not kept
            assert indirect._early_socket is None


def test_an_early_socket_that_failed_leaves_the_attempt_its_own_error() -> None:
    """Nothing listens any more: the early connect was refused, so the attempt connects by
    itself and fails as it always has (a retryable refusal, then the connect error)."""
    from launcher.remote import Connection
    from launcher.sshopen import RetryableConnect

    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
    doc = persist.endpoint_doc(dataclasses.replace(endpoint(), hostname="127.0.0.1", port=port))
    conn = Connection(persist.endpoint_from_doc(doc))
    sock = prefetch.early_socket(doc)
    if sock is not None:  # refused after the call returned, not during it
        conn.give_socket(sock)
    with pytest.raises(RetryableConnect, match="refused"):
        conn._socket(time.monotonic() + 5)
    assert sock is None or sock.fileno() == -1


def test_an_early_socket_to_a_host_gone_dark_costs_only_the_attempts_budget() -> None:
    """A host that answers no SYN (its accept queue full: the kernel drops them): the early
    connect never completes, and the first attempt waits for it only until its own deadline,
    then times out as a TCP connect does; the budget is not spent twice."""
    from launcher.remote import Connection
    from launcher.sshopen import RetryableConnect

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(0)
        port = server.getsockname()[1]
        queued = []
        for _ in range(4):  # fill the accept queue (its length is the backlog, plus one)
            filler = socket.socket()
            filler.setblocking(False)
            filler.connect_ex(("127.0.0.1", port))
            queued.append(filler)
        time.sleep(0.2)
        ep = dataclasses.replace(endpoint(), hostname="127.0.0.1", port=port, connect_timeout=0.5)
        sock = prefetch.early_socket(persist.endpoint_doc(ep))
        assert sock is not None
        conn = Connection(ep)
        conn.give_socket(sock)
        with pytest.raises(RetryableConnect, match="no TCP connection within connect_timeout"):
            conn._socket(time.monotonic() + 0.5)
        assert sock.fileno() == -1
        for filler in queued:
            filler.close()
