"""A ProxyCommand as the socket under SSH (sshopen.CommandSocket): its end is an end of file,
and what it printed on stderr reaches the error message."""

from __future__ import annotations

import shlex
import time

import pytest

from launcher.transport import sshopen

REFUSED = "ssh: connect to host 127.0.0.2 port 1: Connection refused"


def script(text: str) -> str:
    """A ProxyCommand running `text` (it is run as `exec COMMAND`, as OpenSSH runs it)."""
    return "sh -c " + shlex.quote(text)


def test_an_ended_commands_last_words_reach_the_message(monkeypatch: pytest.MonkeyPatch) -> None:
    """The stderr reader thread may not have read the pipe yet when the command has exited (a
    busy machine): describe waits for the pipe's end rather than lose the reason."""
    read = sshopen.CommandSocket._read_stderr

    def late_reader(self: sshopen.CommandSocket) -> None:
        time.sleep(0.2)
        read(self)

    monkeypatch.setattr(sshopen.CommandSocket, "_read_stderr", late_reader)
    sock = sshopen.CommandSocket(script(f"echo '{REFUSED}' >&2; exit 255"))
    try:
        assert sock.recv(1024) == b""  # its end is an end of file
        assert sock.ended_by_itself()
        assert sock.describe() == f"exit code 255: {REFUSED}"
    finally:
        sock.close()
