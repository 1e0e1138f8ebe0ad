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

from launcher.config.models import load_inventory
from tests.unit.test_docs import problems_of
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
    assert " smoke -t staging " in " ".join(github_step("deploy")["run"].split())
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


def launcher_lines(script: str) -> list[str]:
    """The `launcher …` command lines of a step (continuation lines joined)."""
    joined = script.replace("\\\n", " ")
    return [line.strip() for line in joined.splitlines() if line.strip().startswith("launcher ")]


@pytest.mark.skipif(shutil.which("ssh-agent") is None, reason="needs openssh-client")
def test_github_ssh_steps_use_an_agent_and_a_temp_known_hosts(repo: Path, tmp_path: Path) -> None:
    runner_temp = tmp_path / "runner-temp"
    runner_temp.mkdir()
    github_env = tmp_path / "github-env"
    known = "[10.1.2.6]:22 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIExample"
    env = {
        "RUNNER_TEMP": str(runner_temp),
        "GITHUB_ENV": str(github_env),
        "PVE_SSH_KEY": keypair(tmp_path),
        "PVE_KNOWN_HOSTS": known,
    }
    agent = run_step(github_step("SSH key")["run"], repo, env)
    assert agent.returncode == 0, agent.stderr
    exported = dict(line.split("=", 1) for line in github_env.read_text().splitlines())
    env.update(exported)
    listed = run_step("ssh-add -l", repo, env)
    try:
        assert listed.returncode == 0 and "ED25519" in listed.stdout, listed.stderr
        smoke = github_step("deploy")["run"]
        # The step's own lines up to the smoke: the known_hosts file from the secret.
        setup = "\n".join(line for line in smoke.splitlines() if line.startswith("printf"))
        written = run_step(setup, repo, env)
        assert written.returncode == 0, written.stderr
        assert (runner_temp / "known_hosts").read_text() == known + "\n"
        assert not (repo / "home" / ".ssh").exists()  # the runner's own ~/.ssh is untouched
        (command,) = launcher_lines(smoke)
        assert '--known-hosts "$RUNNER_TEMP/known_hosts"' in command
        assert "--wait-lock 20m" in command
        assert problems_of(command) == []  # every option exists in the CLI
    finally:
        cleanup = run_step(github_step("Clean up")["run"], repo, env)
    assert cleanup.returncode == 0, cleanup.stderr
    assert not (runner_temp / "known_hosts").exists()
    assert run_step("ssh-add -l", repo, env).returncode == 2  # the agent is gone


def test_no_inline_python_in_the_examples() -> None:
    """launcher writes the job summary and takes the known_hosts file itself: no glue."""
    for path in (GITHUB, GITLAB):
        text = path.read_text()
        assert "python3 -" not in text and "<<'PY'" not in text, path
        assert "inventory.ci.yaml" not in text, path


@pytest.mark.skipif(shutil.which("ssh-agent") is None, reason="needs openssh-client")
def test_gitlab_setup_loads_the_key_and_names_the_known_hosts(repo: Path, tmp_path: Path) -> None:
    known_hosts = tmp_path / "PVE_KNOWN_HOSTS"  # GitLab's File variable: a path
    known_hosts.write_text("[10.1.2.6]:22 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIExample\n")
    job = load(GITLAB)["staging-smoke"]
    lines = list(job["before_script"])
    assert lines[0] == "pip install ."
    script = "\n".join([*lines[1:], "ssh-add -l", 'echo "known=$LAUNCHER_KNOWN_HOSTS"'])
    env = {"PVE_SSH_KEY": keypair(tmp_path), "PVE_KNOWN_HOSTS": str(known_hosts)}
    result = run_step(script, repo, env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ED25519" in result.stdout and f"known={known_hosts}" in result.stdout
    (command,) = launcher_lines("\n".join(job["script"]))
    assert "--wait-lock 20m" in command and problems_of(command) == []


def test_github_job_summary_and_annotations_come_from_launcher(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from launcher.core.errors import ExitCode
    from launcher.probe import ci
    from launcher.targets.fleet import Outcome

    crashed = probe(crash_at=9)
    outcomes = [
        Outcome("staging", ExitCode.UNHEALTHY, f"unhealthy: {crashed.reason}", {"probe": crashed}),
        Outcome("canary", ExitCode.OK, "healthy: step 20, 28.0 Ktok/s"),
        Outcome("prod", ExitCode.UNREACHABLE, "x", error="prod: cannot connect: a, b\nhint: c"),
    ]
    summary = tmp_path / "summary.md"
    monkeypatch.delenv("GITHUB_ACTIONS", raising=False)
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    ci.report("smoke", outcomes)  # not under GitHub Actions: nothing
    assert not summary.exists() and capsys.readouterr().err == ""
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    ci.report("smoke", outcomes)
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "::error title=launcher smoke%3A staging unhealthy::" + f"unhealthy: {crashed.reason}",
        "::error title=launcher smoke%3A prod unreachable::prod: cannot connect: a, b%0Ahint: c",
    ]
    text = summary.read_text()
    assert text.startswith("### launcher smoke: 2 of 3 failed\n")
    assert "| canary | ✅ ok | 0 | healthy: step 20, 28.0 Ktok/s |" in text
    assert "| prod | ❌ unreachable | 3 | prod: cannot connect: a, b hint: c |" in text
    assert "- **staging** `alive`: pane dead, exit status 1" in text
    ci.report("smoke", outcomes[1:2])  # appended, as each step's summary is
    assert summary.read_text().count("### launcher smoke") == 2
