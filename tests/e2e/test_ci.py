"""What a CI job and a first-time user meet on a real host: one known_hosts file for every host
(--known-hosts, LAUNCHER_KNOWN_HOSTS), connection errors that name their real cause, and the job
summary and annotations launcher writes itself under GitHub Actions."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.e2e.project import Project

pytestmark = pytest.mark.e2e

VMID = 203
WORKFLOW = Path(__file__).resolve().parents[2] / "examples" / "github-actions-smoke.yml"


def test_known_hosts_for_every_host_from_the_option_or_the_environment(
    project: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    empty = project.root / "empty_known_hosts"
    empty.write_text("")
    project.write({"ci": (VMID, project.playbook("ci"))}, host=project.host(known_hosts=str(empty)))
    refused = project.launcher("status")
    assert refused.returncode == 3, refused.stderr
    assert f"is not in {empty}" in refused.stderr and "ssh-keyscan" in refused.stderr
    known = str(project.info.known_hosts)
    for args in (("--known-hosts", known, "status"), ("status", "--known-hosts", known)):
        given = project.launcher(*args)
        assert given.returncode in (0, 1), given.stderr  # reached: judged, not unreachable
        assert "host key" not in given.stderr
    monkeypatch.setenv("LAUNCHER_KNOWN_HOSTS", known)
    from_env = project.launcher("status")
    assert from_env.returncode in (0, 1), from_env.stderr
    # The override wins over the inventory's own (good) file too.
    project.write({"ci": (VMID, project.playbook("ci"))})
    monkeypatch.setenv("LAUNCHER_KNOWN_HOSTS", str(empty))
    overridden = project.launcher("status")
    assert overridden.returncode == 3 and f"is not in {empty}" in overridden.stderr


def test_connection_errors_name_their_cause(project: Project) -> None:
    missing = project.root / "no-such-key"
    book = project.playbook("ci")
    project.write({"ci": (VMID, book)}, host=project.host(identity_file=str(missing)))
    checked = project.launcher("inventory", "check")
    assert checked.returncode == 2, checked.stdout
    assert f"identity file not found: {missing}" in checked.stderr
    status = project.launcher("status")
    assert status.returncode == 3, status.stderr
    assert f"identity file {missing}: not found" in status.stderr
    assert "sshd is running" not in status.stderr and "check the address" not in status.stderr
    doctor = project.launcher("doctor")
    assert doctor.returncode == 3 and "✗ auth" in doctor.stderr
    assert "identity_file" in doctor.stderr and "sshd" not in doctor.stderr

    project.write({"ci": (VMID, book)}, host=project.host(port=1, connect_timeout=2))
    refused = project.launcher("status")
    assert refused.returncode == 3
    assert "nothing listens on 127.0.0.1:1" in refused.stderr, refused.stderr

    project.write({"ci": (VMID, book)}, host=project.host(address="no-such-host.invalid"))
    unresolved = project.launcher("status")
    assert unresolved.returncode == 3
    assert "the name no-such-host.invalid does not resolve" in unresolved.stderr


def test_no_upload_shown_before_an_unknown_host_key_stops_the_deploy(project: Project) -> None:
    empty = project.root / "empty_known_hosts"
    empty.write_text("")
    project.write({"ci": (VMID, project.playbook("ci"))}, host=project.host(known_hosts=str(empty)))
    deploy = project.launcher("deploy", "--restart")
    assert deploy.returncode == 3
    assert "✓" not in deploy.stderr and "upload  " not in deploy.stderr, deploy.stderr


def test_github_actions_summary_and_annotations(
    project: Project, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    book = project.playbook("cicrash", env={"DEMO_MODE": "crash", "DEMO_CRASH_AFTER": "2"})
    project.write({"cicrash": (VMID, book)})
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    smoke = project.launcher("smoke", "--wait", "20", "--json", timeout=90)
    assert smoke.returncode == 1, smoke.stderr
    assert json.loads(smoke.stdout)["exit_code"] == 1  # stdout stays the JSON document alone
    errors = [line for line in smoke.stderr.splitlines() if line.startswith("::error ")]
    assert len(errors) == 1, smoke.stderr
    assert errors[0].startswith("::error title=launcher smoke%3A cicrash unhealthy::")
    text = summary.read_text()
    assert text.startswith("### launcher smoke: 1 of 1 failed")
    assert "| cicrash | ❌ unhealthy | 1 |" in text and "`alive`: pane dead" in text
    project.kill_session(VMID, "cicrash")


def test_the_github_job_runs_with_no_key_file_and_the_key_in_an_agent(
    project: Project, tmp_path: Path
) -> None:
    """examples/github-actions-smoke.yml's steps, as written, on a runner without the key file
    the inventory names (the README's walkthrough writes one): the key only in the job's
    ssh-agent, known_hosts only in the file `--known-hosts` names."""
    missing = tmp_path / "operator" / ".ssh" / "id_ed25519"  # on an operator's machine only
    host = project.host(identity_file=str(missing), known_hosts="~/.ssh/known_hosts")
    project.write({"staging": (VMID, project.playbook("staging"))}, host=host)
    runner_temp, home = tmp_path / "runner-temp", tmp_path / "runner-home"
    runner_temp.mkdir()
    home.mkdir()
    env = {
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        "HOME": str(home),
        "CI": "true",
        "GITHUB_ACTIONS": "true",
        "GITHUB_ENV": str(tmp_path / "github-env"),
        "GITHUB_STEP_SUMMARY": str(tmp_path / "summary.md"),
        "RUNNER_TEMP": str(runner_temp),
        "PVE_SSH_KEY": project.info.identity_file.read_text(),
        "PVE_KNOWN_HOSTS": project.info.known_hosts.read_text().strip(),
    }
    agent = job_step("SSH key", project.root, env)
    assert agent.returncode == 0, agent.stderr
    env.update(line.split("=", 1) for line in Path(env["GITHUB_ENV"]).read_text().splitlines())
    try:
        smoke = job_step("deploy", project.root, env, timeout=240)
        assert smoke.returncode == 0, smoke.stderr
        assert json.loads((project.root / "smoke.json").read_text())["exit_code"] == 0
        assert (project.root / "smoke.xml").is_file() and (project.root / "smoke.html").is_file()
        assert f"identity_file {missing} does not exist; using the keys ssh-agent" in smoke.stderr
        assert not missing.exists() and not (home / ".ssh").exists()  # no key file anywhere
    finally:
        cleanup = job_step("Clean up", project.root, env)
        project.kill_session(VMID, "staging")
    assert cleanup.returncode == 0, cleanup.stderr


def job_step(
    name: str, cwd: Path, env: dict[str, str], timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """A step of the example workflow run as the runner runs it (`bash -e`), in `cwd`."""
    steps = yaml.safe_load(WORKFLOW.read_text())["jobs"]["smoke"]["steps"]
    (step,) = [s for s in steps if s.get("name", "").startswith(name)]
    return subprocess.run(
        ["bash", "-e", "-c", step["run"]],
        cwd=cwd,
        env=env,  # the step's own `env:` are secrets, given above under their names
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_identity_option_names_the_key_the_inventory_does_not_have(project: Project) -> None:
    missing = project.root / "no-such-key"
    host = project.host(identity_file=str(missing))
    project.write({"ci": (VMID, project.playbook("ci"))}, host=host)
    assert project.launcher("status").returncode == 3  # no agent here: the file is needed
    status = project.launcher("--identity", str(project.info.identity_file), "status")
    assert status.returncode in (0, 1), status.stderr  # reached: judged, not unreachable
    assert "identity" not in status.stderr


def test_a_wrong_vmid_lists_the_containers_the_host_has(project: Project) -> None:
    project.write({"typo": (299, project.playbook("typo"))})
    status = project.launcher("status")
    assert status.returncode == 3, status.stderr
    assert "container 299 does not exist on the host" in status.stderr
    listed = "hint: containers on this host: 200 (running, sandbox-200), 201 (running"
    assert listed in status.stderr
    doctor = project.launcher("doctor")
    assert doctor.returncode == 3 and "fix: containers on this host: 200 (running" in doctor.stderr
