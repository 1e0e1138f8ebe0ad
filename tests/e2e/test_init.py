"""`launcher init` against the sandbox with a scripted stdin, as a person answers it: the host key
confirmed by its fingerprint, a trial run in the container finding the trainer's own status
lines, then deploy and verify HEALTHY. And what it refuses: a host key not confirmed (nothing
written) and files that exist (kept)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.e2e.project import DEMO_TRAINER, Project

pytestmark = pytest.mark.e2e

VMID = 202
# A trainer of its own shape: `step 317 | loss 2.04 | tok/s 50676 | q_pre 13/16 | q_post 3/16`.
COMMAND = "DEMO_FORMAT=pipes DEMO_INTERVAL=0.5 DEMO_RAMP=3 python3 train.py"


def launcher(
    cwd: Path, *args: str, stdin: str = "", timeout: float = 180
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "launcher", *args],
        cwd=cwd,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def trainer_dir(where: Path) -> Path:
    where.mkdir(parents=True)
    shutil.copy(DEMO_TRAINER, where / "train.py")
    return where


def test_init_then_deploy_and_verify_healthy(project: Project, tmp_path: Path) -> None:
    work = trainer_dir(tmp_path / "mytrainer")
    info = project.info
    answers = [
        f"root@{info.address}:{info.port}",  # host
        "y",  # the host key is the one shown
        str(VMID),
        "train.py",
        COMMAND,
        "",  # name: the default, train
        "",  # no log: a trial run in the container
    ]
    flags = ["--identity-file", str(info.identity_file), "--trial-seconds", "6", "--gpus", "8"]
    init = launcher(work, "init", *flags, stdin="\n".join(answers) + "\n")
    out = init.stdout + init.stderr
    assert init.returncode == 0, out
    host_key = (info.state_dir / "ssh_host_ed25519_key.pub").read_text().split()[1]
    known = (Path.home() / ".ssh" / "known_hosts").read_text()
    assert known == f"[{info.address}]:{info.port} ssh-ed25519 {host_key}\n"
    assert "offers the host key ssh-ed25519 SHA256:" in out and "added to" in out
    assert "status lines: " in out and "keyvalue" in out
    book = yaml.safe_load((work / "playbooks" / "train.yaml").read_text())
    assert book["status"]["format"] == "keyvalue" and book["command"] == COMMAND
    assert "✓ container    CT 202 exists" in out  # doctor ran, and passed
    assert not project.ct_text(VMID, "sh", "-c", "ls -d /tmp/launcher-init-* 2>/dev/null")

    deploy = launcher(work, "deploy")
    assert deploy.returncode == 0, deploy.stdout + deploy.stderr
    verify = launcher(work, "verify", "--wait", "8", "--interval", "1")
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert "train: HEALTHY (exit 0)" in verify.stdout

    again = launcher(work, "init", *flags, stdin="\n".join(answers) + "\n")
    assert again.returncode == 2 and "inventory.yaml exists: nothing written" in again.stderr
    assert yaml.safe_load((work / "playbooks" / "train.yaml").read_text()) == book
    project.kill_session(VMID, "train")


def test_a_host_key_not_confirmed_writes_nothing(project: Project, tmp_path: Path) -> None:
    work = trainer_dir(tmp_path / "other")
    host = f"root@{project.info.address}:{project.info.port}"
    refused = launcher(work, "init", "--vmid", str(VMID), stdin=f"{host}\nn\n")
    assert refused.returncode == 3, refused.stdout + refused.stderr
    assert "host key not trusted: nothing written" in refused.stderr
    assert sorted(p.name for p in work.iterdir()) == ["train.py"]
    assert not (Path.home() / ".ssh" / "known_hosts").exists()
