"""The Python API against the sandbox: the docs' examples run as written, and its errors."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from launcher import Launcher
from launcher.core.errors import ConfigError, ExitCode, LauncherError, RemoteError, UsageError
from tests.e2e.project import Project

pytestmark = pytest.mark.e2e

API_DOC = Path(__file__).resolve().parents[2] / "docs" / "api.md"
VMID = 202


def api_examples() -> list[str]:
    """The ```python blocks of docs/api.md before its Fabric section, in order."""
    text = API_DOC.read_text(encoding="utf-8").split("\n## Fabric tasks", 1)[0]
    return re.findall(r"^```python\n(.*?)^```", text, re.S | re.M)


def test_documented_examples_run_against_the_sandbox(project: Project) -> None:
    examples = api_examples()
    assert len(examples) >= 2
    project.write({"prod": (VMID, project.playbook("apidemo"))})
    # One interpreter for all blocks, in the project's directory (inventory.yaml is there).
    program = "\n\n".join(examples)
    result = subprocess.run(
        [sys.executable, "-c", program],
        cwd=project.root,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert result.returncode == 0, result.stderr + result.stdout
    out = result.stdout
    assert "healthy" in out.splitlines()[1]
    assert "watch ended: prod healthy (exit 0)" in out
    assert "refused:" in out and "exit code 4" in out
    assert "not healthy: True" in out
    assert project.processes(VMID, "train_demo.py") == []  # l.stop() stopped it


def test_errors_carry_the_cli_exit_codes(project: Project, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("hosts: {}\ntargets:\n  prod: {host: nowhere, vmid: 5, playbook: x.yaml}\n")
    with pytest.raises(ConfigError) as config_error:
        Launcher(bad)
    assert config_error.value.exit_code == ExitCode.USAGE
    assert f"{bad}:3: targets.prod.host: unknown host 'nowhere'" in str(config_error.value)

    # A closed port: unreachable, exit code 3, raised (not a result).
    closed = project.host(port=1, connect_timeout=2)
    project.write({"prod": (VMID, project.playbook("apidemo"))}, host=closed)
    with Launcher(project.inventory) as launcher, pytest.raises(RemoteError) as remote_error:
        launcher.status("prod")
    assert remote_error.value.exit_code == ExitCode.UNREACHABLE


def test_results_are_typed_and_connections_are_shared(project: Project) -> None:
    project.write({"prod": (VMID, project.playbook("apidemo"))})
    before = project.sshd_logins()
    lines: list[str] = []
    with Launcher(project.inventory, on_line=lines.append) as launcher:
        report = launcher.deploy(restart=True)  # default_target
        status = launcher.status()
        stopped = launcher.stop()
    assert len(report.sha256) == 64 and any(s.name == "launch" for s in report.steps)
    assert status.probe.run is not None and status.record is not None
    assert stopped.exit_code == ExitCode.OK
    assert project.sshd_logins(at_least=before + 1) - before == 1  # three operations, one login


def test_the_clis_newer_deploy_options_and_smoke_through_the_api(project: Project) -> None:
    project.write({"prod": (VMID, project.playbook("apiopts"))})
    with Launcher(project.inventory) as api:
        # Bad values: UsageError (exit code 2) before any connection, as the CLI's exit 2.
        for bad in (
            {"env": ["NOEQUALS"]},
            {"env": "A=1"},
            {"wait_lock": -1},
            {"checkpoints": "shred"},
            {"message": 5},
        ):
            with pytest.raises(UsageError) as caught:
                api.deploy("prod", restart=True, **bad)  # type: ignore[arg-type]
            assert caught.value.exit_code == ExitCode.USAGE
        api.deploy("prod", restart=True, message="first")
        # One run recorded: nothing to go back to, refused with the CLI's exit code.
        with pytest.raises(LauncherError) as refused:
            api.rollback("prod", restart=True, wait_lock=5)
        cli = project.launcher("rollback", "-t", "prod", "--restart", "--wait-lock", "5s")
        assert refused.value.exit_code == cli.returncode == ExitCode.REFUSED
        api.deploy(
            "prod",
            restart=True,
            env=["SEED=41"],
            sets=["stop_grace=2"],
            message="second",
            wait_lock=5,
        )
        newest = api.history("prod", limit=1).records[0]
        assert newest["message"] == "second" and newest["env"] == ["SEED"]
        assert newest["set"] == ["stop_grace=2"]
        # The same script twice, the first run without --env: a rollback puts that run back, as
        # the CLI's does (which undoes it); the API's diff names what changed, not the value.
        rolled = api.rollback("prod", restart=True, wait_lock=5)
        assert rolled.exit_code == ExitCode.OK and "SEED" not in run_file(project)
        cli = project.launcher("rollback", "-t", "prod", "--restart", "--wait-lock", "5s")
        assert cli.returncode == 0 and "export SEED=41" in run_file(project)
        runs = [r["run"] for r in api.history("prod").records if r.get("outcome") == "launched"]
        diff = api.history("prod", diff=(runs[1], runs[0])).diff
        assert diff is not None and {"aspect": "env added", "names": ["SEED"]} in diff["changes"]
        smoked = api.smoke("prod", wait=3)
        assert smoked.healthy and smoked.probe.exit_code == ExitCode.OK
        assert smoked.deploy.sha256
        api.stop("prod")


def run_file(project: Project) -> str:
    """The run file of the `apiopts` playbook's session (its env, as the run gets it)."""
    return project.ct_text(VMID, "cat", "/root/apiopts/.launcher/apiopts.run")


def test_watch_through_the_api_ends_on_its_duration_or_on_stop(project: Project) -> None:
    crashing = project.playbook(
        "apicrash", env={"DEMO_MODE": "crash", "DEMO_CRASH_AFTER": "3"}, verify={"wait": 2}
    )
    project.write({"prod": (VMID, crashing)})
    kinds: list[str] = []
    with Launcher(project.inventory) as launcher:
        launcher.deploy("prod", restart=True)
        crashed = launcher.watch(
            "prod", duration=12, interval=1, on_event=lambda event: kinds.append(event.kind)
        )
        assert crashed.exit_code == ExitCode.UNHEALTHY, crashed.summary
        assert crashed.statuses["prod"].status == "failed" and not crashed.stopped
        assert "unhealthy" in kinds

        # No duration: it runs until stop(), here from a timer thread once it watches.
        began = time.monotonic()
        stopped = launcher.watch(
            "prod", started=lambda session: threading.Timer(1.0, session.stop).start()
        )
        assert stopped.stopped and stopped.exit_code == ExitCode.OK, stopped.summary
        assert time.monotonic() - began < 10
