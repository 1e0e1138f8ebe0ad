"""Connect retries (ssh.SSHConnection._connect, with tenacity): only the retryable failures are
retried, at most CONNECT_ATTEMPTS times, the pause doubling, and never past the one deadline."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from launcher.core.errors import AuthError, ConnectError
from launcher.transport import ssh, sshopen
from launcher.transport.endpoint import Endpoint


def endpoint(connect_timeout: float) -> Endpoint:
    return Endpoint(
        name="pve",
        hostname="10.0.0.5",
        port=22,
        user="root",
        identity_files=(),
        known_hosts=Path("/nonexistent"),
        accept_new=False,
        jump=None,
        connect_timeout=connect_timeout,
        command_timeout=30.0,
    )


class Attempts:
    """sshopen.open_once stood in for: fails with each of `failures` in turn, then connects."""

    def __init__(self, failures: list[Exception]) -> None:
        self.failures = failures
        self.times: list[float] = []

    def __call__(self, client: Any, ep: Endpoint, sock: Any, deadline: float, pkey: Any) -> str:
        assert sock == "sock" and deadline > time.monotonic() - 0.05
        self.times.append(time.monotonic())
        if self.failures:
            raise self.failures.pop(0)
        return "client"


@pytest.fixture
def attempts(monkeypatch: pytest.MonkeyPatch) -> Attempts:
    made = Attempts([])
    monkeypatch.setattr(sshopen, "open_once", made)
    monkeypatch.setattr(ssh.SSHConnection, "_new_client", lambda self: "client")
    monkeypatch.setattr(ssh.SSHConnection, "_socket", lambda self, deadline: "sock")
    return made


def test_attempts_end_at_the_limit_with_the_last_failure_worded(attempts: Attempts) -> None:
    attempts.failures = [sshopen.RetryableConnect(f"refused {i}") for i in range(5)]
    with pytest.raises(ConnectError, match=r"cannot connect to root@10.0.0.5:22: refused 2"):
        ssh.SSHConnection(endpoint(10.0))._connect()
    assert len(attempts.times) == ssh.CONNECT_ATTEMPTS


def test_a_failure_that_is_not_retryable_is_raised_at_once(attempts: Attempts) -> None:
    attempts.failures = [AuthError("pve: key refused")]
    with pytest.raises(AuthError, match="key refused"):
        ssh.SSHConnection(endpoint(10.0))._connect()
    assert len(attempts.times) == 1
