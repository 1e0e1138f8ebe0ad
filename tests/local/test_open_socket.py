"""The TCP socket under SSH (sshopen.open_socket): Nagle's algorithm off, failures worded."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from launcher.transport import sshopen
from launcher.transport.endpoint import Endpoint


def endpoint(port: int) -> Endpoint:
    return Endpoint(
        name="pve",
        hostname="127.0.0.1",
        port=port,
        user="root",
        identity_files=(),
        known_hosts=Path("/nonexistent"),
        accept_new=False,
        jump=None,
        connect_timeout=5.0,
        command_timeout=30.0,
    )


@pytest.fixture
def listening() -> Iterator[int]:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        yield server.getsockname()[1]


def test_the_socket_sends_each_packet_at_once(listening: int) -> None:
    """paramiko writes whole SSH packets; with Nagle on, a small one waits for a delayed ACK."""
    ep = endpoint(listening)
    with sshopen.open_socket(ep, time.monotonic() + ep.connect_timeout) as sock:
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
        assert sock.getpeername() == ("127.0.0.1", listening)


@pytest.mark.skipif(sshopen.QUICKACK is None, reason="TCP_QUICKACK is Linux's")
def test_every_read_asks_for_an_immediate_ack(
    listening: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """sshd (Nagle on) holds its reply to the first channel open until we ACK its hostkeys
    message; Linux delays that ACK by 40 ms unless TCP_QUICKACK is set, and does not keep it
    set: so before every read. The socket stays what paramiko needs (timeout, peer, fileno)."""
    ep = endpoint(listening)
    asked: list[tuple[int, int, int]] = []
    real = socket.socket.setsockopt

    def spy(self: socket.socket, *args: int) -> None:
        asked.append(args)  # type: ignore[arg-type]
        real(self, *args)  # type: ignore[call-overload]

    with sshopen.open_socket(ep, time.monotonic() + ep.connect_timeout) as sock:
        assert isinstance(sock, sshopen.QuickAckSocket)
        assert sock.gettimeout() is not None and sock.fileno() >= 0
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
        monkeypatch.setattr(socket.socket, "setsockopt", spy)
        sock.settimeout(0.05)
        for _ in range(2):
            with pytest.raises(TimeoutError):  # nothing to read: the option is still set first
                sock.recv(1)
    quick = (socket.IPPROTO_TCP, sshopen.QUICKACK, 1)
    assert asked == [quick, quick]


def test_a_closed_port_is_a_retryable_failure_that_names_it() -> None:
    with socket.socket() as probe:  # a port that was free a moment ago: nothing listens
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    ep = endpoint(port)
    with pytest.raises(sshopen.RetryableConnect) as caught:
        sshopen.open_socket(ep, time.monotonic() + ep.connect_timeout)
    assert caught.value.hint is not None
    assert f"nothing listens on 127.0.0.1:{port}" in caught.value.hint
