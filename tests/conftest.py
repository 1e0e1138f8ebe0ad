"""The suite's tiers, as pytest markers (pyproject.toml lists them):

  unit    pure: no process, socket or sandbox of its own (the bulk of tests/unit); a unit test
          that starts a process or binds or connects a socket fails (_unit_tier_is_pure)
  local   tests/unit modules that run real local things: the agent with tmux, interpreters,
          Unix sockets, `ssh -G`
  e2e     tests/e2e: against a sandbox (real sshd, LXC, tmux; root)
  timing  asserts how long something took: run after the rest (`./run test`), on two workers
          of their own (they mostly wait), since a loaded machine makes it flaky and it makes
          nothing else flaky

unit/local/e2e come from where a test lives (below); timing is marked on the test itself.
The e2e files run longest first (tests/e2e/weights.py says why), each file's tests in order.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.weights import file_seconds, weight

# pytest keeps each test module's assertion-rewritten code in __pycache__, but not where
# PYTHONDONTWRITEBYTECODE is set: then every worker of every tier rewrote every module again
# (about 9 s of CPU each, most of its collection). Only this process's flag is cleared: the
# variable still reaches every process the tests start.
sys.dont_write_bytecode = False

HERE = Path(__file__).resolve().parent
# tests/unit modules that start real processes or sockets (the `local` tier).
LOCAL_MODULES = frozenset(
    {
        "test_agent.py",
        "test_agent_cache.py",
        "test_agent_package.py",
        "test_buckets.py",
        "test_cli_contract.py",
        "test_command_socket.py",
        "test_config_cli.py",
        "test_examples.py",
        "test_open_socket.py",
        "test_operate.py",
        "test_persist.py",
        "test_project_manifest.py",
        "test_protocol_contract.py",
        "test_provenance.py",
        "test_python_floor.py",
        "test_quoting.py",
        "test_sandbox_rootfs.py",
        "test_sshconfig.py",
        "test_startup_interrupt.py",
        "test_status.py",
        "test_status_imports.py",
        "test_watch.py",
    }
)


def tier(path: Path) -> str:
    if path.is_relative_to(HERE / "e2e"):
        return "e2e"
    return "local" if path.name in LOCAL_MODULES else "unit"


def pytest_configure(config: pytest.Config) -> None:
    """Ctrl-C reaches the processes the tests start: a suite started in the background of a
    non-interactive shell (`cmd &`, as some CI runners and nohup do) has SIGINT ignored, and an
    ignored signal stays ignored across fork and exec, so every `launcher logs -f` a test
    sends C-c to would ignore it and the test would time out, testing the shell, not launcher."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        item.add_marker(getattr(pytest.mark, tier(Path(str(item.path)))))
    seconds = file_seconds()

    def order(item: pytest.Item) -> tuple[int, float]:
        path = Path(str(item.path))
        return (1, -weight(path, seconds)) if tier(path) == "e2e" else (0, 0.0)

    items.sort(key=order)  # stable: a file's tests keep their order


class TierViolation(AssertionError):
    """A `unit` test started a process or opened a socket of its own."""


def _refuse(what: str) -> Callable[..., Any]:
    def refused(*args: object, **kwargs: object) -> Any:
        raise TierViolation(
            f"a unit-tier test {what}: list its module in LOCAL_MODULES (tests/conftest.py) "
            "so that it runs in the local tier"
        )

    return refused


@pytest.fixture(autouse=True)
def _unit_tier_is_pure(request: pytest.FixtureRequest) -> Iterator[None]:
    """The unit marker's promise, kept by the suite: no process and no bound or connected socket
    (socketpair, a pair of ends in memory, is fine). A test that needs one belongs to `local`."""
    if tier(Path(str(request.node.path))) != "unit":
        yield
        return
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(subprocess.Popen, "_execute_child", _refuse("started a process"))
        patch.setattr(os, "fork", _refuse("forked"))
        patch.setattr(os, "posix_spawn", _refuse("spawned a process"))
        patch.setattr(os, "posix_spawnp", _refuse("spawned a process"))
        for method in ("bind", "connect", "connect_ex"):
            patch.setattr(socket.socket, method, _refuse(f"called socket.{method}"))
        yield
