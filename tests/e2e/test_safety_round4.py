"""Safety, round 4, on the sandbox: launcher deletes only what it made, prunes no checkpoint
archive without the user's word, checks the command before the stop, and holds at the edges
(closed output streams, odd project trees, a watcher killed mid-restart).

Each case is one a user or a hostile tester produced; on the code before, each lost something.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from launcher.sandbox import Sandbox
from tests.e2e.conftest import missing_requirements

pytestmark = pytest.mark.e2e


def sandbox_cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "launcher", "sandbox", *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def snapshot(folder: Path) -> list[tuple[str, bytes]]:
    return sorted(
        (str(p.relative_to(folder)), p.read_bytes() if p.is_file() else b"")
        for p in folder.rglob("*")
    )


# -- 1. sandbox down deletes only what the sandbox made


def test_sandbox_down_refuses_a_directory_it_did_not_make(tmp_path: Path) -> None:
    """A mistyped --state-dir (or LAUNCHER_SANDBOX_DIR) pointing at someone's files."""
    reason = missing_requirements()
    if reason:
        pytest.skip(reason)
    folder = tmp_path / "home"
    (folder / "lxc").mkdir(parents=True)  # even names a sandbox uses
    (folder / "inventory.yaml").write_text("hosts: {}\n")
    (folder / "thesis.tex").write_text("years of work\n")
    before = snapshot(folder)
    down = sandbox_cli("down", "--state-dir", str(folder))
    assert down.returncode == 2, down.stdout + down.stderr
    assert f"refusing to remove {folder}: it has no .launcher-sandbox" in down.stderr
    assert "sandbox removed" not in down.stdout
    assert snapshot(folder) == before
    up = sandbox_cli("up", "--vmid", "320", "--state-dir", str(folder))
    assert up.returncode == 2, up.stdout + up.stderr
    assert "is not a sandbox's state dir" in up.stderr
    assert snapshot(folder) == before


def test_sandbox_down_keeps_a_users_files_in_its_state_dir(tmp_path: Path) -> None:
    reason = missing_requirements()
    if reason:
        pytest.skip(reason)
    state = tmp_path / "sandbox"
    sb = Sandbox(state)
    try:
        sb.up([310], gpus=1)
        (state / "notes.md").write_text("how I set this up\n")
        (state / "playbooks" / "mine.yaml").write_text("name: mine\n")
        down = sandbox_cli("down", "--state-dir", str(state))
    finally:
        if (state / ".launcher-sandbox").exists():
            sb.down()
    assert down.returncode == 0, down.stdout + down.stderr
    assert "kept what it did not make: notes.md, playbooks/mine.yaml" in down.stdout
    assert (state / "notes.md").read_text() == "how I set this up\n"
    assert (state / "playbooks" / "mine.yaml").read_text() == "name: mine\n"
    assert sorted(p.name for p in state.iterdir()) == [".launcher-sandbox", "notes.md", "playbooks"]
    assert not (state / "lxc").exists() and not (state / "id_ed25519").exists()
    states = subprocess.run(
        ["lxc-info", "-n", "310", "-P", str(state / "lxc"), "-s"], capture_output=True, check=False
    )
    assert b"RUNNING" not in states.stdout
    assert not sb.status().sshd_alive
