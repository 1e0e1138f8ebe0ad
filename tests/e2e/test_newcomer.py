"""A newcomer's first minutes: the README's sandbox commands, taken from the README itself and
run verbatim in bash, in a fresh copy of the repository (no .venv, nothing installed), as root.

The copy has its own state dir (LAUNCHER_SANDBOX_DIR) and its own directory for the `launcher`
shim (LAUNCHER_SHIM_DIR, first on PATH), so it touches no other sandbox and no /usr/local/bin.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
MARKER = "<!-- newcomer-commands"


def readme_commands() -> list[str]:
    """The console block right after the marker, its `$ ` lines without the prompt."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    after = text[text.index(MARKER) :]
    start = after.index("```console\n") + len("```console\n")
    block = after[start : after.index("\n```", start)]
    return [line[2:] for line in block.splitlines() if line.startswith("$ ")]


def fresh_copy(destination: Path) -> None:
    """The repository's tracked files as they are in this checkout: what a clone would hold
    (edits not yet committed included, so the test judges the README being changed)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file():
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, destination / name)


def test_readme_sandbox_commands_run_verbatim(tmp_path: Path) -> None:
    commands = readme_commands()
    assert commands[0] == "./run demo" and commands[-1] == "launcher sandbox down", commands
    clone, shims, state = tmp_path / "clone", tmp_path / "bin", tmp_path / "state"
    clone.mkdir()
    shims.mkdir()
    fresh_copy(clone)
    assert not (clone / ".venv").exists()
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("LAUNCHER_") and key not in ("VIRTUAL_ENV", "PYTHONPATH")
    }
    env.update(
        PATH=f"{shims}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        LAUNCHER_SANDBOX_DIR=str(state),
        LAUNCHER_SHIM_DIR=str(shims),
    )
    script = "set -euo pipefail\n" + "".join(f"echo '+ {c}'\n{c}\n" for c in commands)
    try:
        result = subprocess.run(
            ["bash", "-c", script],
            cwd=clone,
            env=env,
            capture_output=True,
            text=True,
            timeout=1200,
            check=False,
        )
    finally:  # whatever failed, nothing of the copy's sandbox is left behind
        down = [sys.executable, "-m", "launcher", "sandbox", "down", "--state-dir", str(state)]
        subprocess.run(down, capture_output=True, timeout=300, check=False)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-6000:]
    shim = (shims / "launcher").read_text()
    assert str(clone / ".venv" / "bin" / "launcher") in shim
    assert f"launcher is on PATH: {shims}/launcher" in out
    assert "sandbox: HEALTHY (exit 0)" in out  # the demo's verify, then the README's
    # after the eval, launcher found the sandbox's inventory with no -i: status and logs ran
    assert "+ launcher status" in out and "+ launcher logs --tail 5" in out
    assert f"sandbox removed: {state}" in out
    assert not (state / "lxc").exists()
