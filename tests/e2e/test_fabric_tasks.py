"""`fab` with launcher's tasks against the sandbox: the CLI's outputs and exit codes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.project import Project

pytestmark = pytest.mark.e2e

FABFILE_DIR = Path(__file__).resolve().parent / "fabfile_project"
FAB = Path(sys.executable).with_name("fab")
VMID = 203


def fab(
    project: Project, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """The real `fab` binary, run in a directory that holds only the user's fabfile."""
    assert FAB.is_file(), f"fab is not installed next to {sys.executable}"
    workdir = project.root / "fab"
    workdir.mkdir(exist_ok=True)
    shutil.copy(FABFILE_DIR / "fabfile.py", workdir / "fabfile.py")
    return subprocess.run(
        [str(FAB), *args],
        cwd=workdir,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def test_fab_lists_the_tasks(project: Project) -> None:
    result = fab(project, "--list")
    assert result.returncode == 0, result.stderr
    for name in ("deploy", "verify", "status", "stop", "logs"):
        assert name in result.stdout


def test_fab_deploy_then_verify_healthy(project: Project) -> None:
    project.write({"prod": (VMID, project.playbook("fabdemo"))})
    inventory = str(project.inventory)

    deployed = fab(project, "deploy", "--target", "prod", "--restart", "--inventory", inventory)
    assert deployed.returncode == 0, deployed.stderr
    assert "deployed prod (sandbox CT 203)" in deployed.stdout

    # The inventory from the environment, as for the CLI; the CLI's output and exit code.
    env = {"LAUNCHER_INVENTORY": inventory}
    verified = fab(project, "verify", "--target", "prod", "--wait", "3", env=env)
    cli = project.launcher("status", "-t", "prod")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert "prod: HEALTHY (exit 0)" in verified.stdout
    assert cli.returncode == 0

    status = fab(project, "status", "-t", "prod", env=env)
    assert status.returncode == 0 and "prod" in status.stdout

    logs = fab(project, "logs", "--target", "prod", "--tail", "3", env=env)
    assert logs.returncode == 0 and len(logs.stdout.splitlines()) == 3

    stopped = fab(project, "stop", "--target", "prod", env=env)
    assert stopped.returncode == 0, stopped.stderr
    assert project.processes(VMID, "train_demo.py") == []
    # The run is gone: status now exits 1 through fab as through the CLI.
    after = fab(project, "status", "-t", "prod", env=env)
    assert after.returncode == 1 == project.launcher("status", "-t", "prod").returncode


def test_fab_verify_of_a_crashing_run_exits_1_like_the_cli(project: Project) -> None:
    book = project.playbook("fabcrash", env={"DEMO_MODE": "crash", "DEMO_CRASH_AFTER": "2"})
    project.write({"prod": (VMID, book)})
    inventory = str(project.inventory)
    deployed = fab(project, "deploy", "-t", "prod", "--restart", "-i", inventory)
    assert deployed.returncode == 0, deployed.stderr

    verified = fab(project, "verify", "-t", "prod", "--wait", "20", "-i", inventory)
    assert verified.returncode == 1, verified.stdout + verified.stderr
    assert "prod: FAILED (exit 1)" in verified.stdout  # the state of a run that crashed
    cli = project.launcher("verify", "-t", "prod", "--wait", "20")
    assert cli.returncode == 1


def test_fab_bad_inventory_exits_2_and_unknown_target_too(project: Project) -> None:
    project.write({"prod": (VMID, project.playbook("fabdemo"))})
    missing = fab(project, "status", "--inventory", str(project.root / "nope.yaml"))
    assert missing.returncode == 2
    assert "nope.yaml" in missing.stderr and "Traceback" not in missing.stderr
    unknown = fab(project, "status", "-t", "ghost", "-i", str(project.inventory))
    assert unknown.returncode == 2 and "unknown target 'ghost'" in unknown.stderr
