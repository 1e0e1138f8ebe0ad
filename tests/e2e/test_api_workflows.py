"""One run function per command, reached by the CLI and the API alike: the same results, the
same JSON, on the sandbox; a smoke whose deploy fails is a row and a JSON item for the CLI (the
fleet goes on) and the deploy's own error for the API."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest

from launcher import Launcher
from launcher.core.errors import ExitCode, LauncherError
from launcher.schemas import shipped
from tests.e2e.project import Project

pytestmark = pytest.mark.e2e

GOOD, BAD = 202, 203
# exec fails on a command line this long: the transaction refuses it (exit 2) before any stop.
TOO_LONG = "python3 train_demo.py " + "--flag " * 30_000


def _books(project: Project) -> dict[str, tuple[int, dict[str, Any]]]:
    good = project.playbook("wfgood", verify={"wait": 3, "successes": 2})
    bad = project.playbook("wfbad", command=TOO_LONG)
    return {"wfgood": (GOOD, good), "wfbad": (BAD, bad)}


def _json(result: Any) -> dict[str, Any]:
    assert result.stdout.strip(), result.stderr
    document: dict[str, Any] = json.loads(result.stdout)
    return document


def test_a_smoke_whose_deploy_fails_is_a_row_for_the_cli_and_an_error_for_the_api(
    project: Project,
) -> None:
    project.write(_books(project))
    try:
        both = project.launcher("smoke", "-t", "wfgood,wfbad", "--wait", "3", "--json")
        document = _json(both)
        jsonschema.Draft202012Validator(shipped("smoke")).validate(document)
        assert both.returncode == document["exit_code"] == ExitCode.USAGE
        items = {item["target"]: item for item in document["targets"]}
        assert items["wfgood"]["exit_code"] == 0 and items["wfgood"]["deploy"]["ok"]
        assert items["wfgood"]["verify"]["verdict"] == "healthy"
        failed = items["wfbad"]
        assert failed["verify"] is None and failed["deploy"]["ok"] is False
        assert failed["exit_code"] == failed["deploy"]["exit_code"] == ExitCode.USAGE
        assert "command is" in failed["deploy"]["error"]

        alone = project.launcher("smoke", "-t", "wfbad", "--wait", "3")
        assert alone.returncode == ExitCode.USAGE
        with Launcher(project.inventory) as api, pytest.raises(LauncherError) as raised:
            api.smoke("wfbad", wait=3)
        assert raised.value.exit_code == ExitCode.USAGE
        assert raised.value.message == failed["deploy"]["error"]
        assert project.processes(BAD, "train_demo.py") == []  # nothing was launched
    finally:
        project.kill_session(GOOD, "wfgood")
        project.kill_session(BAD, "wfbad")


def test_the_api_and_the_cli_give_the_same_results(project: Project) -> None:
    """status, history and doctor: the API's result is what the CLI prints (its summary, and
    its `to_json()` the target's item of `--json`, the run's timings aside)."""
    project.write(_books(project))
    try:
        assert project.launcher("deploy", "--restart", "-t", "wfgood").returncode == 0
        with Launcher(project.inventory) as api:
            history = api.history("wfgood", limit=1)
            doctor = api.doctor("wfgood")
            status = api.status("wfgood")
            stopped = api.stop("wfgood")
        assert _json(project.launcher("history", "-t", "wfgood", "--limit", "1", "--json"))[
            "targets"
        ] == [history.to_json()]
        by_cli = _json(project.launcher("doctor", "-t", "wfgood", "--json"))["targets"][0]
        ours = doctor.to_json()
        assert [(c["name"], c["status"]) for c in by_cli["checks"]] == [
            (c["name"], c["status"]) for c in ours["checks"]
        ]
        assert by_cli["exit_code"] == ours["exit_code"] and by_cli["target"] == "wfgood"

        item = status.to_json()
        assert item["target"] == "wfgood" and item["exit_code"] == int(status.exit_code) == 0
        assert item["deployed"] == status.record and "schema" in item
        assert list(item)[-2:] in (["deployed", "log_age"], ["log_age", "gpus"])
        assert stopped.exit_code == ExitCode.OK and stopped.to_json()["steps"]
        # A stopped run: status through the CLI and the API, the same verdict and summary.
        cli = project.launcher("status", "-t", "wfgood", "--json")
        with Launcher(project.inventory) as api:
            after = api.status("wfgood")
        document = _json(cli)
        assert cli.returncode == int(after.exit_code) == document["exit_code"] == 1
        assert document["state"] == str(after.state) and document["reason"] == after.probe.reason
    finally:
        project.kill_session(GOOD, "wfgood")
