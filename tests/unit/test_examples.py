"""The CI examples in examples/: valid workflows, triggers that match, steps that really work.

The schemas are the published GitHub workflow and GitLab CI schemas that check-jsonschema
vendors (a dev extra): no network is needed, and the test fails, never skips, without it.
The shell steps that set up SSH, the inventory and the job summary are run here as written.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from launcher.config import load_inventory
from tests.unit.test_htmlreport import probe

ROOT = Path(__file__).resolve().parents[2]
GITHUB = ROOT / "examples" / "github-actions-smoke.yml"
GITLAB = ROOT / "examples" / "gitlab-ci.yml"
BIN = Path(sys.executable).parent


def check_jsonschema(schema: str, path: Path) -> subprocess.CompletedProcess[str]:
    tool = BIN / "check-jsonschema"
    assert tool.exists(), "check-jsonschema missing: pip install -e '.[dev]'"
    return subprocess.run(
        [str(tool), "--builtin-schema", schema, str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def load(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def github_step(name: str) -> dict[str, Any]:
    steps = load(GITHUB)["jobs"]["smoke"]["steps"]
    return next(s for s in steps if s.get("name", "").startswith(name))


@pytest.mark.parametrize(
    ("schema", "path"),
    [("vendor.github-workflows", GITHUB), ("vendor.gitlab-ci", GITLAB)],
)
def test_example_is_valid_and_a_broken_copy_is_not(schema: str, path: Path, tmp_path: Path) -> None:
    result = check_jsonschema(schema, path)
    assert result.returncode == 0, result.stdout + result.stderr
    # The same check must catch a mistake: a misspelt key in the job (a text edit, so that
    # nothing else changes: PyYAML would turn the workflow's `on:` into `true:`).
    text = path.read_text()
    key = "timeout-minutes:" if "timeout-minutes:" in text else "timeout:"
    broken = tmp_path / path.name
    broken.write_text(text.replace(f"  {key}", "  timeout_minutes:", 1))
    result = check_jsonschema(schema, broken)
    assert result.returncode != 0 and "timeout_minutes" in result.stdout, result.stdout


def staging_script() -> str:
    """The script the staging target's playbook deploys, relative to the repository."""
    target = load_inventory(ROOT / "inventory.yaml").target("staging")
    return target.playbook.script_source.relative_to(ROOT).as_posix()


def test_triggers_match_the_playbook_that_the_smoke_deploys() -> None:
    workflow = load(GITHUB)
    assert "launcher smoke -t staging" in " ".join(github_step("deploy")["run"].split())
    # PyYAML reads the key `on` as True (YAML 1.1).
    paths = workflow[True]["push"]["paths"]
    assert staging_script() in paths and "playbooks/dflash-smoke.yaml" in paths
    assert workflow["permissions"] == {"contents": "read", "checks": "write"}
    job = load(GITLAB)["staging-smoke"]
    assert "launcher smoke -t staging" in " ".join(job["script"])
    changes = [c for rule in job["rules"] for c in rule.get("changes", [])]
    assert staging_script() in changes and "playbooks/dflash-smoke.yaml" in changes


def test_reports_are_uploaded() -> None:
    upload = github_step("Upload the reports")
    assert upload["if"] == "always()"
    assert set(upload["with"]["path"].split()) == {"smoke.html", "smoke.xml", "smoke.json"}
    smoke = " ".join(github_step("deploy")["run"].split())
    assert "--junit smoke.xml" in smoke and "--report smoke.html" in smoke
    artifacts = load(GITLAB)["staging-smoke"]["artifacts"]
    assert artifacts["when"] == "always" and artifacts["reports"]["junit"] == "smoke.xml"
    assert "smoke.html" in artifacts["paths"]


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """The files the CI steps read, laid out as in the repository."""
    work = tmp_path / "repo"
    (work / "launcher" / "sandbox").mkdir(parents=True)
    shutil.copy(ROOT / "inventory.yaml", work)
    shutil.copytree(ROOT / "playbooks", work / "playbooks")
    shutil.copy(ROOT / "launcher" / "sandbox" / "demo_trainer.py", work / "launcher" / "sandbox")
    return work


def run_step(script: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    full = {"PATH": f"{BIN}:{os.environ['PATH']}", "HOME": str(cwd / "home"), **env}
    (cwd / "home").mkdir(exist_ok=True)
    return subprocess.run(
        ["bash", "-eo", "pipefail", "-c", script],
        cwd=cwd,
        env=full,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def keypair(where: Path) -> str:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(where / "key")], check=True
    )
    return (where / "key").read_text()


@pytest.mark.skipif(shutil.which("ssh-agent") is None, reason="needs openssh-client")
def test_github_ssh_steps_use_an_agent_and_a_temp_known_hosts(repo: Path, tmp_path: Path) -> None:
    runner_temp = tmp_path / "runner-temp"
    runner_temp.mkdir()
    github_env = tmp_path / "github-env"
    env = {
        "RUNNER_TEMP": str(runner_temp),
        "GITHUB_ENV": str(github_env),
        "PVE_SSH_KEY": keypair(tmp_path),
        "PVE_KNOWN_HOSTS": "[10.1.2.6]:22 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIExample",
    }
    agent = run_step(github_step("SSH key")["run"], repo, env)
    assert agent.returncode == 0, agent.stderr
    exported = dict(line.split("=", 1) for line in github_env.read_text().splitlines())
    env.update(exported)
    listed = run_step("ssh-add -l", repo, env)
    try:
        assert listed.returncode == 0 and "ED25519" in listed.stdout, listed.stderr
        hosts = run_step(github_step("known_hosts")["run"], repo, env)
        assert hosts.returncode == 0, hosts.stdout + hosts.stderr
        exported = dict(line.split("=", 1) for line in github_env.read_text().splitlines())
        assert exported["LAUNCHER_INVENTORY"] == "inventory.ci.yaml"
        inventory = load_inventory(repo / "inventory.ci.yaml")
        known = {h.known_hosts for h in inventory.spec.hosts.values()}
        assert known == {str(runner_temp / "known_hosts")}
        assert (runner_temp / "known_hosts").stat().st_mode & 0o077 == 0
        assert not (repo / "home" / ".ssh").exists()  # the runner's own ~/.ssh is untouched
    finally:
        cleanup = run_step(github_step("Clean up")["run"], repo, env)
    assert cleanup.returncode == 0, cleanup.stderr
    assert not (runner_temp / "known_hosts").exists() and not (repo / "inventory.ci.yaml").exists()
    assert run_step("ssh-add -l", repo, env).returncode == 2  # the agent is gone


@pytest.mark.skipif(shutil.which("ssh-agent") is None, reason="needs openssh-client")
def test_gitlab_setup_loads_the_key_and_checks_the_inventory(repo: Path, tmp_path: Path) -> None:
    known_hosts = tmp_path / "PVE_KNOWN_HOSTS"  # GitLab's File variable: a path
    known_hosts.write_text("[10.1.2.6]:22 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIExample\n")
    lines = [line for line in load(GITLAB)["staging-smoke"]["before_script"]]
    assert lines[0] == "pip install ."
    script = "\n".join([*lines[1:], "ssh-add -l", 'echo "inventory=$LAUNCHER_INVENTORY"'])
    env = {"PVE_SSH_KEY": keypair(tmp_path), "PVE_KNOWN_HOSTS": str(known_hosts)}
    result = run_step(script, repo, env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ED25519" in result.stdout and "inventory=inventory.ci.yaml" in result.stdout
    assert not (repo / "inventory.ci.yaml").exists()  # removed when the job's shell ends


def test_github_job_summary_from_the_junit_report(tmp_path: Path) -> None:
    from launcher.verify.report import to_junit

    (tmp_path / "smoke.xml").write_text(to_junit([("staging", probe(crash_at=9), None)]))
    summary = tmp_path / "summary.md"
    step = github_step("Job summary")
    assert step["if"] == "always()"
    result = run_step(step["run"], tmp_path, {"GITHUB_STEP_SUMMARY": str(summary)})
    assert result.returncode == 0, result.stderr
    rows = summary.read_text().splitlines()
    assert "| launcher.staging | alive | FAIL | observed pane dead, exit status 1;" in "\n".join(
        rows
    )
    assert any(r.startswith("| launcher.staging | samples | pass |") for r in rows)
    # No report at all (the smoke never ran): the summary says so and the step still passes.
    (tmp_path / "smoke.xml").unlink()
    summary.unlink()
    result = run_step(step["run"], tmp_path, {"GITHUB_STEP_SUMMARY": str(summary)})
    assert result.returncode == 0 and "no JUnit report" in summary.read_text()
