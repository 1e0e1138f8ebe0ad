"""The suite's tiers: a test's tier is the directory it lives in, tests/<tier>/, and pytest
gets it as a marker of the same name (pyproject.toml lists them; `./run test` selects by them):

  unit    pure: no process, socket or sandbox of its own; a unit test that starts a process
          or binds or connects a socket fails (_unit_tier_is_pure)
  local   real local things, no sandbox: the agent with tmux, interpreters, Unix sockets,
          `ssh -G`
  e2e     against a sandbox (real sshd, LXC, tmux; root)
  timing  asserts how long something took: run after the rest (`./run test`), on two workers
          of their own (they mostly wait), since a loaded machine makes it flaky and it makes
          nothing else flaky. A timing test that uses the sandbox is marked `e2e` as well, and
          its JUnit record says so (tests/require_e2e.py counts it as end-to-end)

A tier marker written on a test by hand must agree with its directory: one that does not is
refused at collection (a test in two tiers would run twice, or in the wrong one).
The e2e and timing files run longest first (tests/e2e/weights.py says why), each file's tests
in order.
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

from tests.e2e.weights import WEIGHED, file_seconds, weight

# pytest keeps each test module's assertion-rewritten code in __pycache__, but not where
# PYTHONDONTWRITEBYTECODE is set: then every worker of every tier rewrote every module again
# (about 9 s of CPU each, most of its collection). Only this process's flag is cleared: the
# variable still reaches every process the tests start.
sys.dont_write_bytecode = False

HERE = Path(__file__).resolve().parent
TIERS = ("unit", "local", "e2e", "timing")


def tier(path: Path) -> str:
    """The tier of a test file: its directory under tests/, "" for a file elsewhere (refused,
    as a directory that is no tier's, by pytest_collection_modifyitems)."""
    path = path.resolve()
    parts = path.relative_to(HERE).parts if path.is_relative_to(HERE) else ()
    return parts[0] if len(parts) > 1 else ""


def markers_of(item: pytest.Item) -> set[str]:
    """The tier markers a test carries: its directory's, and `e2e` for a timing test that uses
    the sandbox (tests/e2e/conftest.py's `sandbox`, directly or through another fixture). A
    tier marker written by hand that says otherwise is refused: the test would run in two
    tiers, or in the wrong one."""
    name = tier(Path(str(item.path)))
    if name not in TIERS:
        raise pytest.UsageError(
            f"{item.nodeid}: a test lives in the directory of its tier, one of "
            + ", ".join(f"tests/{t}" for t in TIERS)
        )
    needs_sandbox = "sandbox" in getattr(item, "fixturenames", ())
    markers = {name, "e2e"} if name == "timing" and needs_sandbox else {name}
    by_hand = {m.name for m in item.iter_markers() if m.name in TIERS} - markers
    if by_hand:
        raise pytest.UsageError(
            f"{item.nodeid} is marked {', '.join(sorted(by_hand))} by hand: the tier of a test "
            f"is its directory (tests/conftest.py); move it to tests/{sorted(by_hand)[0]}"
        )
    return markers


def pytest_configure(config: pytest.Config) -> None:
    """Ctrl-C reaches the processes the tests start: a suite started in the background of a
    non-interactive shell (`cmd &`, as some CI runners and nohup do) has SIGINT ignored, and an
    ignored signal stays ignored across fork and exec, so every `launcher logs -f` a test
    sends C-c to would ignore it and the test would time out, testing the shell, not launcher."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        markers = markers_of(item)
        for marker in sorted(markers):
            item.add_marker(getattr(pytest.mark, marker))
        # The JUnit report says which tests needed the sandbox (tests/require_e2e.py).
        item.user_properties.append(("tiers", " ".join(sorted(markers))))
    seconds = file_seconds()

    def order(item: pytest.Item) -> tuple[int, float]:
        path = Path(str(item.path))
        return (1, -weight(path, seconds)) if tier(path) in WEIGHED else (0, 0.0)

    items.sort(key=order)  # stable: a file's tests keep their order


class TierViolation(AssertionError):
    """A `unit` test started a process or opened a socket of its own."""


def _refuse(what: str) -> Callable[..., Any]:
    def refused(*args: object, **kwargs: object) -> Any:
        raise TierViolation(
            f"a unit-tier test {what}: move its module to tests/local (tests/conftest.py), "
            "the tier of real processes and sockets"
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
