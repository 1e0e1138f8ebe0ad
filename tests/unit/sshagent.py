"""A real ssh-agent of a test's own, for the local tier (it starts a process)."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def running_agent(where: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """ssh-agent listening on a socket under `where`, SSH_AUTH_SOCK naming it; no key yet."""
    if shutil.which("ssh-agent") is None:
        pytest.skip("needs ssh-agent")
    sock = where / "agent.sock"
    process = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while not sock.exists():
            assert process.poll() is None and time.monotonic() < deadline, "no ssh-agent"
            time.sleep(0.02)
        monkeypatch.setenv("SSH_AUTH_SOCK", str(sock))
        yield sock
    finally:
        process.terminate()
        process.wait(timeout=10)


def add_key(key: Path) -> None:
    added = subprocess.run(["ssh-add", "-q", str(key)], capture_output=True, check=False)
    assert added.returncode == 0, added.stderr


def new_key(path: Path) -> Path:
    """An ed25519 key without a passphrase."""
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path
