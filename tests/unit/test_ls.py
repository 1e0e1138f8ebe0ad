"""`launcher ls`: the inventory's targets, one row each, with no connection made; the same
rows from the CLI (text and --json), the API and a Fabric task."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from launcher import tasks
from launcher.api import Launcher
from launcher.core.requests import LsRequest
from launcher.transport.pool import ConnectionPool
from tests.local.test_cli_contract import run, validate
from tests.unit.test_job import JOB, inventory_with


@pytest.fixture(autouse=True)
def no_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("ls opened a connection")

    monkeypatch.setattr(ConnectionPool, "get", refuse)


def test_one_row_per_target_with_its_host_vmid_and_jobs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inventory = str(inventory_with(tmp_path, JOB))
    code, out, _ = run(capsys, "-i", inventory, "ls")
    assert code == 0
    assert out.splitlines() == [
        "TARGET   HOST  VMID  CLUSTER  JOBS",
        "prod     pve   200   -        train",
        "staging  pve   201   -        train",
    ]


def test_json_is_the_shared_envelope(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inventory = str(inventory_with(tmp_path, JOB))
    code, out, _ = run(capsys, "ls", "--json", "-i", inventory)
    document = json.loads(out)
    validate(document, "ls")
    assert code == document["exit_code"] == 0 and document["schema"] == "launcher.ls/1"
    assert document["targets"][0] == {
        "target": "prod",
        "host": "pve",
        "vmid": 200,
        "cluster": None,
        "jobs": ["train"],
    }


def test_an_inventory_that_does_not_load_is_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(capsys, "-i", str(tmp_path / "nope.yaml"), "ls")
    assert code == 2 and "nope.yaml" in err


def test_the_api_and_the_task_list_the_same_rows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inventory = str(inventory_with(tmp_path, JOB))
    with Launcher(inventory) as launcher:
        listing = launcher.run(LsRequest())
    assert [row.target for row in listing.rows] == ["prod", "staging"]
    capsys.readouterr()
    given = {"known_hosts": None, "identity": None, "quiet": False, "debug": False}
    tasks.ls.body(None, inventory=inventory, json=True, **given)  # exit 0: no invoke Exit
    assert json.loads(capsys.readouterr().out) == listing.to_json()
