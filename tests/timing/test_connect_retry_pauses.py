"""How long connect retries pause (ssh.SSHConnection._connect): the pause doubles, and none is
taken that would end past the deadline. Which failures are retried:
tests/unit/test_connect_retry.py."""

from __future__ import annotations

import time

import pytest

from launcher.core.errors import ConnectError
from launcher.transport import ssh, sshopen
from tests.unit import test_connect_retry
from tests.unit.test_connect_retry import Attempts, endpoint

attempts = test_connect_retry.attempts  # the fixture


def test_a_retryable_failure_is_retried_with_a_doubling_pause(attempts: Attempts) -> None:
    attempts.failures = [sshopen.RetryableConnect("reset"), sshopen.RetryableConnect("reset")]
    connects = ssh.STATS.connects
    assert ssh.SSHConnection(endpoint(10.0))._connect() == "client"
    assert len(attempts.times) == 3
    first, second = (b - a for a, b in zip(attempts.times, attempts.times[1:], strict=False))
    assert ssh.RETRY_PAUSE <= first < ssh.RETRY_PAUSE + 0.15
    assert 2 * ssh.RETRY_PAUSE <= second < 2 * ssh.RETRY_PAUSE + 0.15
    assert ssh.STATS.connects == connects + 1


def test_no_pause_is_taken_that_ends_past_the_deadline(attempts: Attempts) -> None:
    """0.3 s budget: the first pause (0.2 s) fits, the second (0.4 s) does not."""
    attempts.failures = [sshopen.RetryableConnect("timed out") for _ in range(5)]
    started = time.monotonic()
    with pytest.raises(ConnectError, match="timed out"):
        ssh.SSHConnection(endpoint(0.3))._connect()
    assert len(attempts.times) == 2
    assert time.monotonic() - started < 0.3 + 0.1
