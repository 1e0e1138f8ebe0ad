"""Which code a run is: a deploy from a git work tree records its commit, branch and uncommitted
changes in the container's history, and status, history and the HTML report show it."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.e2e.project import DEMO_TRAINER, Project, json_out

pytestmark = pytest.mark.e2e

VMID = 202


def git(where: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(where), "-c", "user.name=t", "-c", "user.email=t@t", *args],
        capture_output=True,
        check=True,
        text=True,
    )
    return done.stdout.strip()


def test_a_deploy_from_a_dirty_tree_records_its_commit_and_changes(project: Project) -> None:
    source = project.root / "trainer repo"
    source.mkdir()
    git(source, "init", "-q", "-b", "fix/batching")
    shutil.copy(DEMO_TRAINER, source / "train_demo.py")
    (source / "README").write_text("the trainer\n")
    git(source, "add", ".")
    git(source, "commit", "-q", "-m", "trainer")
    commit = git(source, "rev-parse", "HEAD")
    with (source / "train_demo.py").open("a") as script:
        script.write("# an uncommitted fix\n")
    (source / "notes $(x).txt").write_text("untracked\n")

    book = project.playbook("prov", script={"source": str(source / "train_demo.py"),
                                            "dest": "train_demo.py"})  # fmt: skip
    project.write({"prov": (VMID, book)})
    deployed = project.launcher("deploy", "--restart", "-m", "batching fix")
    assert deployed.returncode == 0, deployed.stdout + deployed.stderr

    record = json_out(project.launcher("history", "--json", "--limit", "1"))["records"][0]
    assert record["source"]["commit"] == commit
    assert record["source"]["branch"] == "fix/batching"
    assert record["source"]["dirty"] is True
    assert sorted(record["source"]["changed"]) == ["notes $(x).txt", "train_demo.py"]
    assert "1 file changed, 1 insertion(+)" in record["source"]["diffstat"]

    described = f"{commit[:12]} (fix/batching) + 2 uncommitted files"
    history = project.launcher("history", "--limit", "1")
    assert f"source       {described}" in history.stdout, history.stdout
    status = project.launcher("status")
    assert f"source: {described}" in status.stdout, status.stdout
    report = project.root / "report.html"
    verified = project.launcher("verify", "--wait", "3", "--report", str(report))
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert described in report.read_text()


def test_a_deploy_from_outside_a_work_tree_records_no_source(project: Project) -> None:
    source = project.root / "plain"
    source.mkdir()
    shutil.copy(DEMO_TRAINER, source / "train_demo.py")
    book = project.playbook("prov2", script={"source": str(source / "train_demo.py"),
                                             "dest": "train_demo.py"})  # fmt: skip
    project.write({"prov2": (VMID, book)})
    deployed = project.launcher("deploy", "--restart")
    assert deployed.returncode == 0, deployed.stdout + deployed.stderr
    record = json_out(project.launcher("history", "--json", "--limit", "1"))["records"][0]
    assert "source" not in record
    assert "source" not in project.launcher("history", "--limit", "1").stdout
