"""Many targets at once, and the CI `smoke` command, on the sandbox."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.e2e.project import Project

pytestmark = pytest.mark.e2e

FLEET = (200, 201, 202, 203)


@pytest.fixture
def fleet(project: Project) -> Project:
    project.sandbox.up(FLEET, gpus=8)
    books = {}
    for vmid in FLEET:
        name = f"fleet{vmid}"
        books[name] = (vmid, project.playbook(name, verify={"wait": 3, "successes": 2}))
    project.write(books)
    return project


def kill_all(project: Project) -> None:
    for vmid in FLEET:
        project.kill_session(vmid, f"fleet{vmid}")


def table_rows(stdout: str) -> dict[str, tuple[str, int]]:
    """The closing table's rows: target -> (state, exit code)."""
    rows = {}
    in_table = False
    for line in stdout.splitlines():
        parts = line.split()
        if parts[:3] == ["target", "state", "exit"]:
            in_table = True
        elif in_table and len(parts) >= 3 and parts[2].isdigit() and parts[0] != "overall":
            rows[parts[0]] = (parts[1], int(parts[2]))
    return rows


def test_deploy_and_verify_all_in_parallel(fleet: Project) -> None:
    try:
        deployed = fleet.launcher("deploy", "--restart", "--all")
        assert deployed.returncode == 0, deployed.stdout + deployed.stderr
        rows = table_rows(deployed.stdout)
        assert rows == {f"fleet{v}": ("ok", 0) for v in FLEET}
        assert "overall exit 0" in deployed.stdout
        # progress lines carry the target's name in plain (non-TTY) mode
        assert "[fleet200] ✓ upload" in deployed.stderr

        verified = fleet.launcher(
            "verify", "-t", "fleet200,fleet201", "-t", "fleet202", "-t", "fleet203"
        )
        assert verified.returncode == 0, verified.stdout + verified.stderr
        assert all(state == ("healthy", 0) for state in table_rows(verified.stdout).values())
        assert len(table_rows(verified.stdout)) == 4

        status = fleet.launcher("status", "--all")
        assert status.returncode == 0, status.stdout + status.stderr
        assert table_rows(status.stdout) == {f"fleet{v}": ("healthy", 0) for v in FLEET}

        doctor = fleet.launcher("doctor", "--all")
        assert doctor.returncode == 0, doctor.stdout + doctor.stderr
        assert all(row == ("ok", 0) for row in table_rows(doctor.stdout).values())

        stopped = fleet.launcher("stop", "--all", "--grace", "2")
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        assert all(row == ("ok", 0) for row in table_rows(stopped.stdout).values())
        assert all(not fleet.processes(v, "train_demo.py") for v in FLEET)
    finally:
        kill_all(fleet)


def test_one_stopped_container_gives_exit_3_for_it_only(fleet: Project) -> None:
    fleet.sandbox.stop_container(203)
    try:
        result = fleet.launcher("deploy", "--restart", "--all", "--parallel", "2")
    finally:
        fleet.sandbox.start_container(203)
        kill_all(fleet)
    assert result.returncode == 3, result.stdout + result.stderr
    rows = table_rows(result.stdout)
    assert rows["fleet203"] == ("unreachable", 3)
    assert [rows[f"fleet{v}"] for v in (200, 201, 202)] == [("ok", 0)] * 3
    assert "overall exit 3" in result.stdout


def test_groups_select_targets(fleet: Project) -> None:
    inventory = fleet.inventory.read_text() + "groups:\n  pair: [fleet200, fleet201]\n"
    fleet.inventory.write_text(inventory)
    result = fleet.launcher("deploy", "--dry-run", "-t", "pair")
    assert result.returncode == 0, result.stderr
    assert set(table_rows(result.stdout)) == {"fleet200", "fleet201"}


def test_smoke_healthy_and_crashing(project: Project, tmp_path: Path) -> None:
    project.write(
        {
            "smokeok": (200, project.playbook("smokeok", verify={"wait": 3, "successes": 2})),
            "smokebad": (
                201,
                project.playbook(
                    "smokebad",
                    env={"DEMO_MODE": "crash", "DEMO_CRASH_AFTER": "2"},
                    verify={"wait": 30},
                ),
            ),
        }
    )
    try:
        junit = tmp_path / "ok.xml"
        ok = project.launcher("smoke", "-t", "smokeok", "--json", "--junit", str(junit))
        assert ok.returncode == 0, ok.stdout + ok.stderr
        document = json.loads(ok.stdout)
        assert document["deploy"]["ok"] is True
        assert document["verify"]["verdict"] == "healthy"
        suite = ET.parse(junit).getroot().find("testsuite")
        assert suite is not None
        names = [case.get("name") for case in suite.findall("testcase")]
        assert names[0] == "deploy" and "alive" in names
        assert suite.get("failures") == "0" and suite.get("errors") == "0"

        junit_bad = tmp_path / "bad.xml"
        bad = project.launcher("smoke", "-t", "smokebad", "--json", "--junit", str(junit_bad))
        assert bad.returncode == 1, bad.stdout + bad.stderr
        assert json.loads(bad.stdout)["verify"]["verdict"] == "unhealthy"
        failures = ET.parse(junit_bad).getroot().findall(".//failure")
        assert failures and any("Traceback" in (f.text or "") for f in failures)
    finally:
        project.kill_session(200, "smokeok")
        project.kill_session(201, "smokebad")
