"""A ProxyCommand whose child keeps its stderr open (sshopen.CommandSocket) costs at most the
drain time. The socket itself: tests/local/test_command_socket.py."""

from __future__ import annotations

import time

from launcher.transport import sshopen
from tests.local.test_command_socket import script


def test_a_child_holding_stderr_open_bounds_the_wait() -> None:
    """A command that exits while a child of its keeps stderr open: described within the
    drain time, with what it said so far."""
    sock = sshopen.CommandSocket(script("echo 'proxy: gave up' >&2; sleep 5 & exit 1"))
    try:
        assert sock.ended_by_itself()
        started = time.monotonic()
        described = sock.describe()
        assert time.monotonic() - started < sshopen.STDERR_DRAIN_SECONDS + 0.3
        assert described == "exit code 1: proxy: gave up"
    finally:
        sock.close()
