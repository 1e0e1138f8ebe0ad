"""Every `--json` output, for one target and for two, against its shipped schema; progress on
stderr only, silenced by -q; one error printed once. Real CLI, real sandbox, two containers."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import jsonschema
import pytest

from launcher.output.jsonout import schema_name
from launcher.schemas import shipped
from tests.e2e.project import Project

pytestmark = pytest.mark.e2e

PAIR = (200, 201)
NAMES = tuple(f"contract{vmid}" for vmid in PAIR)
BOTH = ",".join(NAMES)


@pytest.fixture
def pair(project: Project) -> Project:
    project.sandbox.up(PAIR, gpus=8)
    books = {
        name: (vmid, project.playbook(name, verify={"wait": 2, "interval": 1, "successes": 2}))
        for name, vmid in zip(NAMES, PAIR, strict=True)
    }
    project.write(books)
    return project


def document(result: subprocess.CompletedProcess[str], command: str) -> dict[str, Any]:
    """stdout is exactly one JSON document, valid against the command's shipped schema."""
    parsed: dict[str, Any] = json.loads(result.stdout)
    jsonschema.Draft202012Validator(shipped(command)).validate(parsed)
    assert parsed["schema"] == schema_name(command)  # verify, status, smoke: /2
    assert parsed["exit_code"] == result.returncode
    return parsed


def both(project: Project, command: str, *args: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The command for one target, then for two: both valid, the same envelope."""
    one = project.launcher(command, *args, "--json", "-t", NAMES[0], timeout=180)
    two = project.launcher(command, *args, "--json", "-t", BOTH, timeout=180)
    assert one.returncode == 0 and two.returncode == 0, one.stderr + two.stderr
    single, double = document(one, command), document(two, command)
    assert [t["target"] for t in single["targets"]] == [NAMES[0]]
    assert [t["target"] for t in double["targets"]] == list(NAMES)
    assert single["target"] == NAMES[0] and "target" not in double
    return single, double


def test_every_command_json_for_one_and_two_targets(pair: Project) -> None:
    try:
        deployed = pair.launcher("deploy", "--restart", "--json", "-t", BOTH)
        assert deployed.returncode == 0, deployed.stderr
        double = document(deployed, "deploy")
        assert all(t["ok"] and len(t["sha256"]) == 64 for t in double["targets"])
        # progress: every step on stderr, named per target, none of it on stdout
        assert f"[{NAMES[1]}] ✓ upload" in deployed.stderr
        assert "✓" not in deployed.stdout

        one = pair.launcher("deploy", "--restart", "--json", "-t", NAMES[0])
        assert one.returncode == 0, one.stderr
        single = document(one, "deploy")
        assert single["sha256"] == single["targets"][0]["sha256"]
        assert "✓ upload" in one.stderr  # one target: plain step lines, no prefix

        verify_one, verify_two = both(pair, "verify")
        assert verify_one["verdict"] == "healthy"  # the published fields, at the top level
        assert verify_one["state"] == "healthy"
        assert {t["verdict"] for t in verify_two["targets"]} == {"healthy"}
        status_one, _ = both(pair, "status")
        assert status_one["targets"][0]["schema"] == "launcher.verify/2"
        history_one, history_two = both(pair, "history", "--limit", "1")
        assert len(history_one["records"]) == 1
        assert all(len(t["records"]) == 1 for t in history_two["targets"])
        doctor_one, _ = both(pair, "doctor")
        assert any(c["name"] == "tmux" for c in doctor_one["checks"])
        smoke_one, smoke_two = both(pair, "smoke")
        assert smoke_one["verify"]["verdict"] == "healthy"
        assert all(t["deploy"]["ok"] for t in smoke_two["targets"])
    finally:
        for name, vmid in zip(NAMES, PAIR, strict=True):
            pair.kill_session(vmid, name)


def test_progress_goes_to_stderr_and_quiet_silences_it(pair: Project) -> None:
    try:
        pair.launcher("deploy", "--restart", "-t", NAMES[0])
        wait = ("--wait", "0.05m", "--interval", "1s")  # units accepted on the command line
        loud = pair.launcher("verify", *wait, "--json", "-t", NAMES[0], timeout=120)
        assert loud.returncode == 0, loud.stderr
        polls = [
            line for line in loud.stderr.splitlines() if "s warmup" in line or "judging" in line
        ]
        assert len(polls) >= 2, loud.stderr  # one plain line per poll off a terminal
        document(loud, "verify")  # stdout: the document and nothing else

        quiet = pair.launcher("verify", *wait, "--json", "-q", "-t", NAMES[0], timeout=120)
        assert quiet.returncode == 0 and quiet.stderr == ""
        document(quiet, "verify")
        stopped = pair.launcher("-q", "stop", "-t", NAMES[0])
        assert stopped.returncode == 0 and stopped.stderr == "", stopped.stderr
        assert stopped.stdout.strip()  # the summary still prints
    finally:
        pair.kill_session(PAIR[0], NAMES[0])


def test_an_unreachable_target_is_an_error_item_printed_once(pair: Project) -> None:
    book = pair.playbook("contractgone")
    pair.write({"contractgone": (PAIR[0], book)}, host=pair.host(port=1, connect_timeout=1))
    result = pair.launcher("deploy", "--json", "-t", "contractgone")
    assert result.returncode == 3
    parsed = document(result, "deploy")
    assert parsed["targets"][0]["ok"] is False and parsed["error"]
    assert result.stderr.count(parsed["error"]) == 1, result.stderr
