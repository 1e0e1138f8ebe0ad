"""The scripting contract without a host: schemas, help, options, completion, errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
import jsonschema
import pytest
from click.shell_completion import ShellComplete

from launcher.cli.completion import COMPLETE_VAR, completion_script
from launcher.cli.main import cli, main
from launcher.output.jsonout import envelope
from launcher.schemas import DIRECTORY, commands, render, shipped
from launcher.schemas.__main__ import main as schemas_main
from tests.unit.projectfiles import write_project


@pytest.fixture
def project(tmp_path: Path) -> Path:
    write_project(tmp_path)
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(inventory.read_text() + "groups:\n  fleet: [prod, staging]\n")
    return tmp_path


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_info:
        main(list(args))
    out, err = capsys.readouterr()
    return int(exit_info.value.code or 0), out, err


def validate(document: dict[str, Any], command: str) -> None:
    jsonschema.Draft202012Validator(shipped(command)).validate(document)


# -- schemas ------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", commands())
def test_shipped_schema_is_what_the_models_generate(command: str) -> None:
    path = DIRECTORY / f"{command}.schema.json"
    assert path.read_text(encoding="utf-8") == render(command), "run: python -m launcher.schemas"
    jsonschema.Draft202012Validator.check_schema(shipped(command))


def test_generator_check_mode_reports_a_stale_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert schemas_main(["--check"]) == 0
    path = DIRECTORY / "doctor.schema.json"
    original = path.read_text(encoding="utf-8")
    try:
        path.write_text(original.replace('"summary"', '"summery"'), encoding="utf-8")
        assert schemas_main(["--check"]) == 1
        assert "doctor.schema.json" in capsys.readouterr().err
    finally:
        path.write_text(original, encoding="utf-8")


def _doctor_item(name: str, code: int = 0) -> dict[str, Any]:
    check = {"name": "config", "status": "ok", "detail": "valid", "fix": None}
    return {"target": name, "exit_code": code, "summary": "all pass", "checks": [check]}


def test_envelope_is_the_same_for_one_and_two_targets() -> None:
    one = envelope("doctor", [_doctor_item("a")], exit_code=0)
    two = envelope("doctor", [_doctor_item("a"), _doctor_item("b", 3)], exit_code=3)
    for document in (one, two):
        validate(document, "doctor")
        assert list(document)[:2] == ["schema", "exit_code"]
    assert one["summary"] == "all pass"  # one target: its fields repeated at the top level
    assert "summary" not in two and len(two["targets"]) == 2
    with pytest.raises(jsonschema.ValidationError):  # several targets never flatten
        validate({**two, "summary": "x"}, "doctor")
    with pytest.raises(jsonschema.ValidationError):  # one target must carry its fields
        validate({k: v for k, v in one.items() if k != "checks"}, "doctor")


def test_a_target_that_failed_is_an_error_item() -> None:
    error = {"target": "b", "ok": False, "exit_code": 3, "error": "cannot connect"}
    validate(envelope("deploy", [error], exit_code=3), "deploy")
    validate(envelope("verify", [error, error], exit_code=3), "verify")


def test_inventory_check_json_is_valid(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(
        capsys, "-i", str(project / "inventory.yaml"), "inventory", "check", "--json"
    )
    assert (code, err) == (0, "")
    document = json.loads(out)
    validate(document, "inventory")
    assert [t["target"] for t in document["targets"]] == ["prod", "staging"]
    assert document["groups"] == {"fleet": ["prod", "staging"]}


def test_buckets_plan_json_is_valid(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("numpy")
    lengths = tmp_path / "lengths.txt"
    lengths.write_text("\n".join(str(10 + (i * 37) % 900) for i in range(2000)) + "\n")
    code, out, _ = run(capsys, "buckets", "plan", str(lengths), "--budget", "4096", "--json")
    assert code == 0
    document = json.loads(out)
    validate(document, "buckets")
    assert document["targets"] == [] and document["boundaries"]


# -- help ---------------------------------------------------------------------------------------


def _leaves(group: click.Group, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    found = []
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            found += _leaves(command, (*path, name))
        else:
            found.append((*path, name))
    return found


@pytest.mark.parametrize("path", _leaves(cli), ids=" ".join)
def test_every_command_help_lists_exit_codes(
    path: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(capsys, *path, "--help")
    assert code == 0
    assert "Exit codes" in out, out


def test_root_help_lists_every_exit_code(capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = run(capsys, "--help")
    for code in ("0 ok", "1 run unhealthy", "2 usage", "3 unreachable", "4 refused", "130", "141"):
        assert code in " ".join(out.split()), code


@pytest.mark.parametrize("option", ["--wait", "--interval", "--window", "--successes"])
def test_probe_options_name_their_playbook_default(
    option: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _, out, _ = run(capsys, "verify", "--help")
    text = " ".join(out.split())
    key = option.removeprefix("--")
    assert f"default: playbook verify.{key}" in text, text


def test_one_target_commands_say_so(capsys: pytest.CaptureFixture[str]) -> None:
    for command in ("logs", "attach"):
        _, out, _ = run(capsys, command, "--help")
        assert "The one target to act on (not a group" in " ".join(out.split())


# -- options ------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["180", "180s", "3m", "0.05h"])
def test_wait_accepts_units(
    value: str, project: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # An unknown target stops the command after the options were parsed, before any connection.
    code, out, err = run(
        capsys, "-i", str(project / "inventory.yaml"), "verify", "--wait", value, "-t", "nosuch"
    )
    assert code == 2 and out == ""
    assert "unknown target 'nosuch'" in err and "duration" not in err


def test_wait_refuses_a_bad_duration(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "verify", "--wait", "3x")
    assert code == 2 and "'3x' is not a duration" in err


def test_global_options_after_the_command(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inventory = str(project / "inventory.yaml")
    code, out, _ = run(capsys, "inventory", "check", "-i", inventory, "--json")
    assert code == 0 and json.loads(out)["inventory"] == inventory
    code, out, err = run(capsys, "history", "--debug", "-q", "-i", inventory, "-t", "nosuch")
    assert code == 2 and out == ""
    assert "unknown target 'nosuch'" in err


def test_launcher_target_env(
    project: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LAUNCHER_TARGET", "envonly")
    inventory = str(project / "inventory.yaml")
    code, _, err = run(capsys, "-i", inventory, "status")
    assert code == 2 and "unknown target 'envonly'" in err
    # -t wins over the environment
    code, _, err = run(capsys, "-i", inventory, "status", "-t", "other")
    assert code == 2 and "'other'" in err and "envonly" not in err


def test_a_one_target_command_refuses_a_group(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, "-i", str(project / "inventory.yaml"), "logs", "-t", "fleet")
    assert code == 2 and out == ""
    assert "acts on one target, not several (prod, staging)" in err


def test_an_error_is_printed_once_on_stderr(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, "-i", str(project / "nope.yaml"), "deploy", "--json")
    assert code == 2 and out == ""
    assert err.count("inventory file not found") == 1, err


# -- completion ---------------------------------------------------------------------------------


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_completion_script(shell: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "completion", shell)
    assert code == 0
    assert out == completion_script(shell, cli)
    assert COMPLETE_VAR in out and "launcher" in out


def test_completion_offers_targets_and_groups(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LAUNCHER_INVENTORY", str(project / "inventory.yaml"))

    def complete(args: list[str], incomplete: str) -> list[str]:
        shell = ShellComplete(cli, {}, "launcher", COMPLETE_VAR)
        return [item.value for item in shell.get_completions(args, incomplete)]

    assert complete(["verify", "-t"], "st") == ["staging"]
    assert complete(["-t"], "") == ["prod", "staging", "fleet"]
    assert complete(["logs", "-t"], "prod,") == ["prod,prod", "prod,staging", "prod,fleet"]
    # -i on the command line is read too; an unreadable inventory offers nothing
    assert complete(["-i", str(project / "missing.yaml"), "deploy", "-t"], "") == []


def test_completion_through_the_environment(project: Path) -> None:
    import os
    import subprocess
    import sys

    env = {
        **os.environ,
        "COMP_WORDS": "launcher status -t pr",
        "COMP_CWORD": "3",
        COMPLETE_VAR: "bash_complete",
        "LAUNCHER_INVENTORY": str(project / "inventory.yaml"),
    }
    result = subprocess.run(
        [sys.executable, "-m", "launcher"], env=env, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["plain,prod"]
