"""The unit tier's promise is enforced, not only stated (tests/conftest.py)."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

import pytest

from tests.conftest import LOCAL_MODULES, TierViolation, tier


def test_this_module_is_in_the_unit_tier() -> None:
    assert tier(Path(__file__)) == "unit"
    assert Path(__file__).name not in LOCAL_MODULES


def test_a_unit_test_cannot_start_a_process() -> None:
    with pytest.raises(TierViolation, match="LOCAL_MODULES"):
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


def test_every_listed_local_module_exists() -> None:
    here = Path(__file__).resolve().parent
    assert sorted(n for n in LOCAL_MODULES if not (here / n).is_file()) == []
