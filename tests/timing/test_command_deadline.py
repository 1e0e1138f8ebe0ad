"""A command over SSH ends at its deadline, and the connection stays usable. The remote layer:
tests/e2e/test_remote.py."""

from __future__ import annotations

import time

import pytest

from launcher.core.errors import CommandTimeout
from launcher.transport.connection import Connection
from tests.e2e import test_remote

conn = test_remote.conn  # the fixture: one connection to the sandbox per module


def test_command_deadline(conn: Connection) -> None:
    started = time.monotonic()
    with pytest.raises(CommandTimeout, match="did not finish within 1 s"):
        conn.run("sleep 30", timeout=1)
    assert time.monotonic() - started < 3
    assert conn.run("echo still usable").out == "still usable\n"
