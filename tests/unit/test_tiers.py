"""The tiers (tests/conftest.py): a test's tier is its directory, and the unit tier's promise is
enforced, not only stated."""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.conftest import HERE, TIERS, TierViolation, markers_of, tier
from tests.e2e.weights import WEIGHED, file_seconds


def test_this_module_is_in_the_unit_tier(request: pytest.FixtureRequest) -> None:
    assert tier(Path(__file__)) == "unit"
    assert request.node.get_closest_marker("unit") is not None
    assert request.node.get_closest_marker("local") is None


def test_the_tier_is_the_directory_under_tests() -> None:
    assert tier(HERE / "local" / "test_agent.py") == "local"
    assert tier(HERE / "timing" / "test_command_deadline.py") == "timing"
    assert tier(HERE / "test_loose.py") == ""  # in no tier's directory
    assert tier(HERE.parent / "launcher" / "test_x.py") == ""


def test_every_test_module_lives_in_a_tiers_directory() -> None:
    misplaced = [
        str(path.relative_to(HERE))
        for path in HERE.rglob("test_*.py")
        if tier(path) not in TIERS and "fixtures" not in path.parts
    ]
    assert misplaced == []


def item(path: Path, *hand: str, fixtures: tuple[str, ...] = ()) -> pytest.Item:
    """What markers_of reads of a collected test."""
    marks = [SimpleNamespace(name=name) for name in hand]

    def iter_markers() -> Iterator[SimpleNamespace]:
        return iter(marks)

    fake = SimpleNamespace(
        path=path, nodeid=f"{path.name}::test_x", fixturenames=fixtures, iter_markers=iter_markers
    )
    return fake  # type: ignore[return-value]


def test_a_timing_test_on_the_sandbox_is_end_to_end_too() -> None:
    timing = HERE / "timing" / "test_x.py"
    assert markers_of(item(timing, fixtures=("project", "sandbox"))) == {"timing", "e2e"}
    assert markers_of(item(timing, fixtures=("tmp_path",))) == {"timing"}
    assert markers_of(item(HERE / "e2e" / "test_x.py", "e2e")) == {"e2e"}


@pytest.mark.parametrize(
    ("directory", "hand"), [("unit", "timing"), ("e2e", "timing"), ("local", "unit")]
)
def test_a_tier_marked_by_hand_against_the_directory_is_refused(directory: str, hand: str) -> None:
    with pytest.raises(pytest.UsageError, match=f"marked {hand} by hand.*tests/{hand}"):
        markers_of(item(HERE / directory / "test_x.py", hand))


def test_a_test_outside_the_tiers_directories_is_refused() -> None:
    with pytest.raises(pytest.UsageError, match="tests/unit, tests/local, tests/e2e"):
        markers_of(item(HERE / "test_loose.py"))


def test_a_unit_test_cannot_start_a_process() -> None:
    with pytest.raises(TierViolation, match="tests/local"):
        subprocess.run(["true"], check=False)
    with pytest.raises(TierViolation):
        os.fork()


@pytest.mark.parametrize("family", [socket.AF_INET, socket.AF_UNIX])
def test_a_unit_test_cannot_bind_or_connect_a_socket(family: socket.AddressFamily) -> None:
    address = ("127.0.0.1", 0) if family == socket.AF_INET else "\0launcher-tier-test"
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        with pytest.raises(TierViolation):
            sock.bind(address)
        with pytest.raises(TierViolation):
            sock.connect(address)


def test_a_socketpair_is_allowed() -> None:
    left, right = socket.socketpair()
    with left, right:
        left.sendall(b"ping")
        assert right.recv(4) == b"ping"


def test_every_weighed_file_exists_in_one_weighed_tier() -> None:
    """tests/e2e/weights.json orders the e2e and timing files by name: a renamed file's old
    name would leave the file at the default weight, out of its place in the order, and a name
    in both directories would give both the same weight."""
    names = [{p.name for p in (HERE / tier).glob("test_*.py")} for tier in WEIGHED]
    assert set.intersection(*names) == set()
    assert sorted(name for name in file_seconds() if name not in set.union(*names)) == []
