"""The tests' own way of running the CLI (tests/e2e/served.py): a call through the worker's
command server answers as a fresh process does, a hung one is killed at its timeout as
subprocess.run kills one, and what the server declines runs as a fresh process."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import time

import pytest

from tests.e2e import served
from tests.e2e.project import Project
from tests.e2e.test_cmdserver import children

pytestmark = pytest.mark.e2e

VMID = 202
NAME = "harness"


def test_a_served_call_answers_as_a_fresh_process(project: Project) -> None:
    project.deploy_healthy(NAME, VMID)
    inventory = ["-i", str(project.inventory)]
    for args in (["status", "-t", NAME, "--json"], ["status", "-t", "nosuchtarget"]):
        mine = served.server().run([*inventory, *args], timeout=60)
        assert mine is not None, "the server did not take the command"
        fresh = dataclasses.replace(project, served=False).launcher(*args)
        assert mine.returncode == fresh.returncode, (args, mine.stderr, fresh.stderr)
        assert mine.stderr == fresh.stderr
        if "--json" in args:
            ours, theirs = json.loads(mine.stdout), json.loads(fresh.stdout)
            assert ours["targets"][0]["verdict"] == theirs["targets"][0]["verdict"] == "healthy"
            assert sorted(ours["targets"][0]) == sorted(theirs["targets"][0])
        else:
            assert mine.returncode == 2 and "nosuchtarget" in mine.stderr, mine.stderr


def test_a_served_call_past_its_timeout_is_killed(project: Project) -> None:
    project.deploy_healthy(NAME, VMID)
    server = served.server()
    started = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        project.launcher("logs", "-t", NAME, "-f", "--tail", "1", timeout=3)
    assert time.monotonic() - started < 10
    deadline = time.monotonic() + 10
    while children(server.process.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert children(server.process.pid) == []


def test_a_declined_command_runs_as_a_fresh_process(project: Project) -> None:
    """A host whose key's passphrase is typed on the terminal is never served (the server's
    child has no terminal): the call falls back to `python -m launcher`."""
    project.write({NAME: (VMID, project.playbook(NAME))}, host=project.host(passphrase="prompt"))
    assert served.server().run(["-i", str(project.inventory), "status"], timeout=30) is None
    result = project.launcher("status", "-t", NAME, "--json")
    assert result.returncode == 1, result.stderr  # no run in that container: not healthy
    report = json.loads(result.stdout)
    assert report["target"] == NAME and report["exit_code"] == 1, report
