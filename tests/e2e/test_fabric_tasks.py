"""`fab` with launcher's tasks against the sandbox: the CLI's outputs and exit codes."""

from __future__ import annotations

import json
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
    for name in ("deploy", "verify", "smoke", "status", "stop", "logs", "history", "rollback"):
        assert name in result.stdout
    assert "doctor" in result.stdout


def test_fab_doctor_is_the_clis_doctor(project: Project) -> None:
    """`fab doctor` runs the same workflow as `launcher doctor`: the same checks, verdicts and
    exit code, the same JSON document; an inventory that does not load is its failed first
    check (exit 2), as for the CLI."""
    project.write({"prod": (VMID, project.playbook("fabdoctor"))})
    env = {"LAUNCHER_INVENTORY": str(project.inventory)}
    by_fab = fab(project, "doctor", "-t", "prod", "--json", env=env)
    by_cli = project.launcher("doctor", "-t", "prod", "--json")
    assert by_fab.returncode == by_cli.returncode, by_fab.stdout + by_fab.stderr
    documents = [json.loads(by_fab.stdout), json.loads(by_cli.stdout)]
    assert documents[0]["schema"] == documents[1]["schema"] == "launcher.doctor/1"
    for key in ("exit_code", "target", "summary"):
        assert documents[0][key] == documents[1][key], key
    shown = [[(c["name"], c["status"]) for c in d["checks"]] for d in documents]
    assert shown[0] == shown[1] and ("container", "ok") in shown[0]
    text = fab(project, "doctor", "-t", "prod", env=env)
    assert text.returncode == by_cli.returncode
    assert text.stdout.strip() == documents[0]["summary"]
    assert "container" in text.stderr  # one line per check, on stderr

    missing = fab(project, "doctor", "-i", str(project.root / "nope.yaml"))
    assert missing.returncode == 2 and "config" in missing.stderr
    assert "Traceback" not in missing.stderr


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
    assert (
        verified.stdout.splitlines()[0].split(" — ")[0]
        == cli.stdout.splitlines()[0].split(" — ")[0]
    )


def test_fab_bad_inventory_exits_2_and_unknown_target_too(project: Project) -> None:
    project.write({"prod": (VMID, project.playbook("fabdemo"))})
    missing = fab(project, "status", "--inventory", str(project.root / "nope.yaml"))
    assert missing.returncode == 2
    assert "nope.yaml" in missing.stderr and "Traceback" not in missing.stderr
    unknown = fab(project, "status", "-t", "ghost", "-i", str(project.inventory))
    assert unknown.returncode == 2 and "unknown target 'ghost'" in unknown.stderr


def test_fab_deploy_options_reach_the_workflow_as_the_clis_do(project: Project) -> None:
    """The CLI's newer deploy options (--env, --set, --command, -m, --wait-lock) as task
    options; history, rollback and smoke as tasks; bad values exit 2 before connecting."""
    project.write({"prod": (VMID, project.playbook("fabopts"))})
    env = {"LAUNCHER_INVENTORY": str(project.inventory)}
    first = fab(project, "deploy", "-t", "prod", "--restart", "-m", "first", env=env)
    assert first.returncode == 0, first.stderr
    # One run recorded: nothing to go back to, refused through fab as through the CLI.
    refused = fab(project, "rollback", "-t", "prod", "--restart", "--wait-lock", "5s", env=env)
    cli = project.launcher("rollback", "-t", "prod", "--restart", "--wait-lock", "5s")
    assert refused.returncode == cli.returncode == 4, refused.stdout + refused.stderr
    assert "no previous" in refused.stderr
    second = fab(
        project,
        *("deploy", "-t", "prod", "--restart", "--env", "SEED=41", "--env", "LR=1"),
        *("--set", "stop_grace=2", "--message", "second", "--wait-lock", "5s"),
        env=env,
    )
    assert second.returncode == 0, second.stdout + second.stderr

    shown = fab(project, "history", "-t", "prod", "--json", "--limit", "1", env=env)
    assert shown.returncode == 0, shown.stderr
    text = json.dumps(json.loads(shown.stdout))
    assert '"env": ["LR", "SEED"]' in text and '"message": "second"' in text
    assert '"set": ["stop_grace=2"]' in text
    records = json.loads(shown.stdout)["records"]
    assert "41" not in json.dumps([r.get("env") for r in records])  # names only
    assert json.loads(project.launcher("history", "--json", "--limit", "1").stdout) == json.loads(
        shown.stdout
    )

    # The same script twice, but the first run without the overrides: a rollback puts that run
    # back (its env), through fab as through the CLI; the second undoes the first.
    run_file = "/root/fabopts/.launcher/fabopts.run"
    rolled = fab(project, "rollback", "-t", "prod", "--restart", "--wait-lock", "5s", env=env)
    assert rolled.returncode == 0, rolled.stdout + rolled.stderr
    assert "SEED" not in project.ct_text(VMID, "cat", run_file)
    cli = project.launcher("rollback", "-t", "prod", "--restart", "--wait-lock", "5s")
    assert cli.returncode == 0, cli.stdout + cli.stderr
    assert "export SEED=41" in project.ct_text(VMID, "cat", run_file)

    smoked = fab(project, "smoke", "-t", "prod", "--wait", "3", "--json", env=env)
    assert smoked.returncode == 0, smoked.stdout + smoked.stderr
    assert json.loads(smoked.stdout)["schema"].startswith("launcher.smoke/")

    # Bad values: the CLI's checks and exit code 2, nothing changed in the container.
    before = project.launcher("history", "--json").stdout
    for args in (
        ("deploy", "--restart", "--env", "NOEQUALS"),
        ("deploy", "--restart", "--wait-lock", "2d"),
        ("deploy", "--restart", "--purge-checkpoints", "--keep-checkpoints"),
        ("verify", "--wait", "-5"),
        ("logs", "--tail", "abc"),
        ("stop", "--parallel", "0"),
    ):
        bad = fab(project, args[0], "-t", "prod", *args[1:], env=env)
        assert bad.returncode == 2, (args, bad.stdout, bad.stderr)
        assert "Traceback" not in bad.stderr
    assert project.launcher("history", "--json").stdout == before
