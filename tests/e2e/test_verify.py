"""`launcher verify` end to end on the sandbox with the demo trainer, healthy and misbehaving."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.project import DEMO_TRAINER, Project, json_out, verify_json

pytestmark = pytest.mark.e2e

VMID = 201


def deploy(project: Project, name: str, **overrides: Any) -> None:
    project.write({name: (VMID, project.playbook(name, **overrides))})
    result = project.launcher("deploy", "--restart")
    assert result.returncode == 0, result.stdout + result.stderr


def verify(project: Project, *args: str) -> tuple[int, dict[str, Any], float]:
    return verify_json(project, *args)


def failed_checks(report: dict[str, Any]) -> set[str]:
    return {c["name"] for c in report["checks"] if c["verdict"] == "fail"}


def test_healthy_run_passes_with_junit(project: Project, tmp_path: Path) -> None:
    deploy(project, "healthy")
    junit = tmp_path / "verify.xml"
    code, report, _ = verify(project, "--junit", str(junit))
    assert code == 0, report
    assert report["verdict"] == "healthy"
    assert failed_checks(report) == set()
    latest = report["samples"][-1]
    assert latest["queues"]["q_pre"] is not None and len(latest["queues"]["q_pre"]) == 6
    assert latest["throughput"] > 1000
    cases = ET.parse(junit).getroot().findall("./testsuite/testcase")
    assert {c.get("name") for c in cases} == {c["name"] for c in report["checks"]}
    assert all(c.find("failure") is None for c in cases)
    # status: one poll, judged at once
    status = project.launcher("status", "--json")
    assert status.returncode == 0, status.stderr
    assert json_out(status)["samples"]
    project.kill_session(VMID, "healthy")


def test_crash_fails_fast_with_traceback(project: Project) -> None:
    deploy(project, "crash", env={"DEMO_MODE": "crash", "DEMO_CRASH_AFTER": "3"})
    code, report, elapsed = verify(project, "--wait", "60", "--interval", "2")
    assert code == 1
    assert elapsed < 15
    assert {"alive", "fatal"} & failed_checks(report)
    assert any("Traceback (most recent call last)" in line for line in report["last_lines"])
    project.kill_session(VMID, "crash")


@pytest.mark.parametrize(
    ("name", "env", "verify_cfg", "failing"),
    [
        (
            "stall",
            {"DEMO_MODE": "stall", "DEMO_STALL_AFTER": "2"},
            {"step": {"stall_after": 3}},
            # A stalled trainer also stops filling its queues: either ends the probe first.
            {"step", "queues.q_pre", "queues.q_hs"},
        ),
        ("flat", {"DEMO_MODE": "flat"}, {"throughput": {"min": 1000}}, {"throughput"}),
        ("nan", {"DEMO_MODE": "nan", "DEMO_NAN_AFTER": "2"}, {}, {"loss"}),
        ("silent", {"DEMO_MODE": "silent"}, {}, {"samples"}),
    ],
)
def test_misbehaving_runs_fail(
    project: Project, name: str, env: dict[str, str], verify_cfg: dict[str, Any], failing: set[str]
) -> None:
    deploy(project, name, env=env, verify={"window": 8, **verify_cfg})
    code, report, _ = verify(project)
    assert code == 1, report
    assert failing & failed_checks(report), report["checks"]  # one of the expected failures
    project.kill_session(VMID, name)


def test_unreachable_host_is_exit_3(project: Project) -> None:
    project.write(
        {"gone": (VMID, project.playbook("gone"))}, host=project.host(port=1, connect_timeout=1)
    )
    code, report, _ = verify(project, "--wait", "0", "--interval", "0.5")
    assert code == 3
    assert report["verdict"] == "unreachable"


def test_hand_started_80_column_session(project: Project) -> None:
    """A person's own session: 80 columns, no launcher files, lines wrapped in the pane."""
    project.ct(VMID, "mkdir", "-p", "/root/byhand")
    project.sandbox.ct_exec(
        VMID, ["sh", "-c", "cat > /root/byhand/train.py"], input=DEMO_TRAINER.read_bytes()
    )
    project.ct(
        VMID,
        "tmux",
        "new-session",
        "-d",
        "-s",
        "byhand",
        "-x",
        "80",
        "-y",
        "24",
        "-c",
        "/root/byhand",
        "env",
        "DEMO_INTERVAL=0.5",
        "DEMO_RAMP=3",
        "python3",
        "train.py",
    )
    project.write({"byhand": (VMID, project.playbook("byhand", workdir="/root/byhand"))})
    code, report, _ = verify(project)
    assert code == 0, report
    assert report["samples"][-1]["queues"]["q_pre"] is not None
    project.kill_session(VMID, "byhand")
