"""A host that stalls the connection (a port that never speaks SSH, one that stops after its
banner, a stalling jump host or ProxyCommand) costs one connect_timeout, not one per poll,
retry or user of the connection. Fixtures and helpers: tests/e2e/test_hostile_remote.py (no
sandbox needed: the stalling ports are this machine's)."""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from launcher.config.models import HostSpec
from launcher.core.errors import ConnectError
from launcher.transport.connection import Connection
from launcher.transport.resolve import resolve_endpoint
from tests.e2e import test_hostile_remote, test_ssh_paths
from tests.e2e.test_hostile_remote import (
    CONNECT_TIMEOUT,
    StallingServer,
    run_timed,
    stalled_inventory,
)
from tests.e2e.test_ssh_paths import ssh_config

silent = test_hostile_remote.silent  # the fixture: a port that accepts and stays silent
home = test_ssh_paths.home  # the fixture: the test's own HOME


# What a command spends besides connecting (starting Python, imports, the config) on a busy
# machine; without the overall deadline the connect alone took three times connect_timeout.
STARTUP = 3.5


@pytest.fixture(params=["silent", "banner"])
def stalled(request: pytest.FixtureRequest) -> Iterator[tuple[str, StallingServer]]:
    """A port that accepts and stays silent, or sends an SSH banner and then stalls."""
    server = StallingServer(b"SSH-2.0-OpenSSH_9.2\r\n" if request.param == "banner" else b"")
    yield request.param, server
    server.close()


def assert_quiet_failure(result: subprocess.CompletedProcess[str]) -> None:
    """No traceback and none of paramiko's own log lines, only launcher's message."""
    everything = result.stdout + result.stderr
    assert "Traceback" not in everything, result.stderr
    assert "Exception (client)" not in everything and "paramiko" not in everything, result.stderr
    assert "No existing session" not in everything


EXPECTED = {
    "silent": "sent no SSH banner within connect_timeout (2 s)",
    "banner": "key exchange did not finish within connect_timeout (2 s)",
}


@pytest.mark.parametrize("command", ["status", "deploy"])
def test_a_port_that_never_speaks_ssh_costs_one_connect_timeout(
    stalled: tuple[str, StallingServer], tmp_path: Path, command: str
) -> None:
    kind, server = stalled
    inventory = stalled_inventory(tmp_path / "project", server.port)
    result, elapsed = run_timed(inventory, command)
    assert result.returncode == 3, result.stdout + result.stderr
    assert elapsed < CONNECT_TIMEOUT + STARTUP, f"{command} took {elapsed:.1f} s"
    assert_quiet_failure(result)
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr
    assert "cannot connect to root@127.0.0.1" in errors[0] and EXPECTED[kind] in errors[0]
    assert "hint:" in result.stderr


def test_verify_does_not_multiply_the_connect_wait(
    stalled: tuple[str, StallingServer], tmp_path: Path
) -> None:
    """verify retries unreachable polls, but a host never reached costs one connect_timeout:
    the later polls fail at once, so the probe takes connect_timeout + 2 intervals."""
    kind, server = stalled
    inventory = stalled_inventory(tmp_path / "project", server.port)
    interval = 1
    result, elapsed = run_timed(inventory, "verify", "--wait", "1", "--interval", str(interval))
    assert result.returncode == 3, result.stdout + result.stderr
    assert elapsed < CONNECT_TIMEOUT + 2 * interval + STARTUP, f"verify took {elapsed:.1f} s"
    assert_quiet_failure(result)
    assert "UNREACHABLE (exit 3)" in result.stdout
    assert "3 polls in a row" in result.stdout and EXPECTED[kind] in result.stdout
    assert len(server.accepted) == 1, "one connection attempt for the whole probe"


def test_a_jump_host_that_stalls_shares_the_budget(silent: StallingServer, tmp_path: Path) -> None:
    inventory = stalled_inventory(
        tmp_path / "project", 22, address="10.255.255.1", jump=f"root@127.0.0.1:{silent.port}"
    )
    result, elapsed = run_timed(inventory, "status")
    assert result.returncode == 3, result.stdout + result.stderr
    assert elapsed < CONNECT_TIMEOUT + STARTUP, f"status took {elapsed:.1f} s"
    assert_quiet_failure(result)
    assert "stalled (jump): cannot connect" in result.stderr
    assert EXPECTED["silent"] in result.stderr


def test_a_failed_connection_fails_fast_afterwards(silent: StallingServer) -> None:
    """Every later use in the process (and every thread waiting for it) gets the same error
    at once instead of a connect_timeout each."""
    spec = HostSpec.model_validate(
        {"address": "127.0.0.1", "port": silent.port, "connect_timeout": 1}
    )
    conn = Connection(resolve_endpoint("stalled", spec))
    started = time.monotonic()
    with pytest.raises(ConnectError, match="no SSH banner") as first:
        conn.run("true")
    assert 0.9 < time.monotonic() - started < 1.5
    started = time.monotonic()
    with pytest.raises(ConnectError) as again:
        conn.run("true")
    assert time.monotonic() - started < 0.1
    assert again.value.message == first.value.message

    fresh = Connection(resolve_endpoint("stalled", spec))
    failures: list[BaseException] = []

    def use() -> None:
        try:
            fresh.run("true")
        except ConnectError as error:
            failures.append(error)

    threads = [threading.Thread(target=use) for _ in range(4)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(failures) == 4
    assert time.monotonic() - started < 1.5, "four users, one connect_timeout"
    assert len(silent.accepted) == 2, "one TCP connection per Connection"


def test_a_proxy_command_that_stalls_costs_one_connect_timeout(home: Path) -> None:
    ssh_config(home, "Host stalls\n  ProxyCommand sleep 60\n")
    spec = HostSpec(address="stalls", connect_timeout=1)
    started = time.monotonic()
    with Connection(resolve_endpoint("x", spec)) as conn, pytest.raises(ConnectError) as error:
        conn.run("true")
    assert time.monotonic() - started < 2
    assert "no SSH banner through the ProxyCommand within connect_timeout (1 s)" in str(error.value)
