"""A project directory deployed as a release, against the sandbox: only changed files travel,
rollback runs the old files again, a failing setup stops nothing, --env reaches the run and is
recorded, and hostile trees are refused before anything is stopped."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.project import DEMO_TRAINER, Project, json_out

pytestmark = pytest.mark.e2e

VMID = 200
NAME = "pkg"


def ok(result: subprocess.CompletedProcess[str], code: int = 0) -> str:
    assert result.returncode == code, result.stdout + result.stderr
    return result.stdout


def make_package(root: Path, version: str = "v1") -> Path:
    """A package-style trainer: a module that reads its config and runs the demo trainer."""
    src = root / "trainer_src"
    (src / "trainer").mkdir(parents=True, exist_ok=True)
    (src / "trainer" / "__init__.py").write_text("")
    (src / "trainer" / "demo.py").write_text(DEMO_TRAINER.read_text())
    (src / "trainer" / "__main__.py").write_text(
        "import json, os, runpy\n"
        "config = json.load(open('config.json'))\n"
        "print('TRAINER VERSION', config['version'], 'SEED', os.environ.get('SEED'), flush=True)\n"
        "runpy.run_module('trainer.demo', run_name='__main__')\n"
    )
    (src / "config.json").write_text(json.dumps({"version": version}))
    (src / "requirements.txt").write_text("numpy\n")
    for i in range(20):  # data code, unchanged between deploys
        (src / "trainer" / f"part{i}.py").write_text(f"VALUE = {i}\n")
    return src


def book(project: Project, src: Path, **extra: Any) -> dict[str, Any]:
    playbook = project.playbook(NAME)
    del playbook["script"]
    playbook["project"] = {"source": str(src), "keep_releases": 3}
    playbook["command"] = "python3 -m trainer"
    playbook.update(extra)
    return playbook


def deploy_json(project: Project, *args: str) -> dict[str, Any]:
    result = project.launcher("deploy", "--restart", "--json", *args)
    ok(result)
    data: dict[str, Any] = json_out(result)
    return data["results"][0] if "results" in data else data


def releases_in_ct(project: Project) -> list[str]:
    """Every entry of releases/ (hidden ones too: a staging directory left would show)."""
    return sorted(project.ct_text(VMID, "ls", "-A", f"/root/{NAME}/releases").split())


def release_info(report: dict[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = report["result"]["release"]
    return found


def pane(project: Project) -> str:
    return project.ct_text(VMID, "cat", f"/root/{NAME}/.launcher/{NAME}.log")


def test_project_deploy_redeploy_rollback(project: Project) -> None:
    src = make_package(project.root)
    project.write({NAME: (VMID, book(project, src))})
    first = release_info(deploy_json(project, "--env", "SEED=41", "-m", "first"))
    assert first["sent_files"] == 25
    project.wait_for(lambda: "TRAINER VERSION v1 SEED 41" in pane(project), what="v1 running")

    (src / "config.json").write_text(json.dumps({"version": "v2"}))
    second = release_info(deploy_json(project, "--set", "stop_grace=2", "-m", "v2 config"))
    assert second["sent_files"] == 1  # only the changed file travelled
    assert second["changes"] == {"added": 0, "changed": 1, "removed": 0}
    assert second["linked_files"] == 24
    project.wait_for(lambda: "TRAINER VERSION v2" in pane(project), what="v2 running")
    link = project.ct_text(VMID, "readlink", f"/root/{NAME}/current").strip()
    assert link == f"releases/{second['id']}"
    # Copies, not hard links: no release shares a file with another (a write to one, a
    # setup's or the run's, cannot change the other).
    inodes = project.ct_text(
        VMID,
        "stat",
        "-c",
        "%i",
        f"/root/{NAME}/releases/{first['id']}/trainer/part3.py",
        f"/root/{NAME}/releases/{second['id']}/trainer/part3.py",
    ).split()
    assert inodes[0] != inodes[1]

    rolled = ok(project.launcher("rollback", "--restart"))
    assert f"release {first['id']}" in rolled
    project.wait_for(
        lambda: pane(project).split("=== launcher run")[-1].count("TRAINER VERSION v1") == 1,
        what="v1 running again",
    )
    link = project.ct_text(VMID, "readlink", f"/root/{NAME}/current").strip()
    assert link == f"releases/{first['id']}"

    history = json_out(project.launcher("history", "--json"))
    text = json.dumps(history)
    assert first["manifest_sha256"] in text and second["id"] in text
    assert '"env": ["SEED"]' in text and '"message": "first"' in text
    assert '"set": ["stop_grace=2"]' in text
    assert "41" not in json.dumps([r.get("env") for r in _records(history)])


def _records(history: Any) -> list[dict[str, Any]]:
    if isinstance(history, dict) and "results" in history:
        history = history["results"][0]
    records = history.get("records") if isinstance(history, dict) else None
    return list(records or [])


def test_failing_setup_stops_nothing(project: Project) -> None:
    src = make_package(project.root)
    project.write({NAME: (VMID, book(project, src))})
    first = release_info(deploy_json(project))
    project.wait_for(lambda: "TRAINER VERSION v1" in pane(project), what="v1 running")
    before = project.processes(VMID, "trainer")
    assert before

    (src / "config.json").write_text(json.dumps({"version": "v2"}))
    kept = releases_in_ct(project)
    failing = book(project, src, setup={"run": ["echo preparing; exit 7"], "inputs": []})
    project.write({NAME: (VMID, failing)})
    result = project.launcher("deploy", "--restart")
    assert result.returncode != 0
    assert "exited 7" in result.stderr and "nothing was stopped" in result.stderr
    assert project.processes(VMID, "trainer") == before
    link = project.ct_text(VMID, "readlink", f"/root/{NAME}/current").strip()
    assert link == f"releases/{first['id']}"
    assert releases_in_ct(project) == kept  # the half-built release was removed

    # A setup that works, then is reused when its inputs did not change.
    working = book(
        project, src, setup={"run": ["echo built > setup.out"], "inputs": ["requirements.txt"]}
    )
    project.write({NAME: (VMID, working)})
    ok(project.launcher("deploy", "--restart"))
    (src / "config.json").write_text(json.dumps({"version": "v3"}))
    again = project.launcher("deploy", "--restart")
    assert "reused from releases/" in ok(again) + again.stderr
    out = project.ct_text(VMID, "cat", f"/root/{NAME}/current/setup.out")
    assert out.strip() == "built"


HOSTILE = ["symlink_root", "big_file", "many_files", "newline_name"]


@pytest.mark.parametrize("kind", HOSTILE)
def test_hostile_trees_refused(project: Project, kind: str) -> None:
    src = make_package(project.root)
    project.write({NAME: (VMID, book(project, src))})
    deploy_json(project)
    project.wait_for(lambda: "TRAINER VERSION v1" in pane(project), what="v1 running")
    before = project.processes(VMID, "trainer")
    if kind == "symlink_root":
        os.symlink("/", src / "root")
        expected = "symlink to a directory"
    elif kind == "big_file":
        with (src / "big.bin").open("wb") as handle:
            handle.truncate(5 * 2**30)  # sparse: 5 GB that take no disk
        expected = "per file"
    elif kind == "many_files":
        many = src / "many"
        many.mkdir()
        for i in range(100_000):
            (many / f"f{i}").touch()
        expected = "more than 20000 files"
    else:
        (src / "bad\nname.py").write_text("x = 1\n")
        expected = "newline"
    result = project.launcher("deploy", "--restart")
    assert result.returncode == 2, result.stdout + result.stderr
    assert expected in result.stderr
    assert project.processes(VMID, "trainer") == before


def test_dry_run_lists_changes_and_diffs_and_changes_nothing(project: Project) -> None:
    src = make_package(project.root)
    project.write({NAME: (VMID, book(project, src))})
    first = release_info(deploy_json(project))
    (src / "config.json").write_text(json.dumps({"version": "v9"}))
    (src / "notes.txt").write_text("new\n")
    (src / "trainer" / "part0.py").unlink()
    before = releases_in_ct(project)
    result = project.launcher("deploy", "--restart", "--dry-run", "--diff")
    out = ok(result) + result.stderr
    assert "changed  config.json" in out and "added    notes.txt (4 bytes)" in out
    assert "removed  trainer/part0.py" in out
    assert '+{"version": "v9"}' in out and '-{"version": "v1"}' in out
    # Without --restart on the running target: the same plan and diff, the restart it needs said.
    preview = project.launcher("deploy", "--dry-run", "--diff")
    shown = ok(preview) + preview.stderr
    assert '+{"version": "v9"}' in shown and "removed  trainer/part0.py" in shown
    assert "! active run   session 'pkg' is running: a deploy refuses (exit 4)" in shown
    assert "· stop         with --restart: session 'pkg'" in shown
    assert "a deploy needs --restart (the run is active)" in preview.stdout
    link = project.ct_text(VMID, "readlink", f"/root/{NAME}/current").strip()
    assert link == f"releases/{first['id']}"
    assert releases_in_ct(project) == before
    doctor = project.launcher("doctor")  # the same planned transaction, the release in it
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    assert "project" in doctor.stdout + doctor.stderr


def test_a_large_change_is_pushed_then_verified(project: Project) -> None:
    """Over the inline limit (4 MiB compressed) the stream goes by `pct push` first."""
    src = make_package(project.root)
    (src / "weights.bin").write_bytes(os.urandom(6 * 2**20))  # random: gzip cannot shrink it
    project.write({NAME: (VMID, book(project, src))})
    result = project.launcher("deploy", "--restart")
    assert "pushed to /root/pkg/.release.launcher-" in ok(result) + result.stderr
    size = project.ct_text(VMID, "stat", "-c", "%s", f"/root/{NAME}/current/weights.bin")
    assert size.strip() == str(6 * 2**20)
    leftovers = project.ct_text(VMID, "find", f"/root/{NAME}", "-maxdepth", "1", "-name", "*.tmp")
    assert leftovers.strip() == ""


def test_bad_overrides_are_usage_errors(project: Project) -> None:
    src = make_package(project.root)
    project.write({NAME: (VMID, book(project, src))})
    for args in (["--set", "nosuch=1"], ["--set", "stop_grace=-1"], ["--env", "1BAD=x"]):
        result = project.launcher("deploy", "--restart", *args)
        assert result.returncode == 2, (args, result.stderr)
