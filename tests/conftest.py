"""The suite's tiers, as pytest markers (pyproject.toml lists them):

  unit    pure: no process, socket or sandbox of its own (the bulk of tests/unit)
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

import signal
import sys
from pathlib import Path

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
        "test_command_socket.py",
        "test_config_cli.py",
        "test_examples.py",
        "test_open_socket.py",
        "test_operate.py",
        "test_persist.py",
        "test_quoting.py",
        "test_sshconfig.py",
        "test_status.py",
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
