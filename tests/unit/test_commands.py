"""The CLI, the API and the Fabric tasks cannot drift: every CLI option of the commands in
launcher.commands.table has a counterpart in the declaration, the API's keywords and the tasks (or
is listed here as deliberately CLI-only, with the reason)."""

from __future__ import annotations

import inspect
from typing import Any

import click
import pytest
from invoke.exceptions import Exit

from launcher import tasks
from launcher.api import Launcher
from launcher.cli.main import cli
from launcher.commands.table import COMMANDS
from launcher.core.errors import ExitCode, UsageError

# The CLI's options that every command shares, and the task option each one is.
GLOBAL_OPTIONS = {
    "target": "target",
    "inventory": "inventory",
    "known_hosts": "known_hosts",
    "identity": "identity",
    "quiet": "quiet",
    "debug": "debug",
    "all": "all",
    "parallel": "parallel",
}
# Options of these commands that a task or the API deliberately does not take: none yet.
# An entry is (command, click parameter name): "why".
CLI_ONLY: dict[tuple[str, str], str] = {}
# Keywords of the API that are not command options: callbacks and the API's own choices.
API_EXTRAS = {"target", "on_step", "on_line", "check"}


def _cli_params(name: str) -> list[click.Parameter]:
    command = cli.commands[name]
    return [p for p in command.params if p.name and p.name != "help"]


def _task_options(name: str) -> list[str]:
    task = getattr(tasks, name)
    return [p for p in inspect.signature(task.body).parameters if p != "c"]


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_cli_option_has_a_declaration_a_task_option_and_an_api_keyword(name: str) -> None:
    command = COMMANDS[name]
    declared = {cli_name: p for p in command.params for cli_name in p.cli_names}
    task_options = _task_options(name)
    api = inspect.signature(getattr(Launcher, name)).parameters
    for param in _cli_params(name):
        assert param.name is not None
        if (name, param.name) in CLI_ONLY:
            continue
        if param.name in GLOBAL_OPTIONS:
            if not command.fleet and param.name in ("all", "parallel"):
                continue
            assert GLOBAL_OPTIONS[param.name] in task_options, (name, param.name)
            continue
        assert param.name in declared, f"`launcher {name}` option {param.name!r} is not declared"
        owner = declared[param.name]
        spelled = [flag for flag, _, _ in owner.flags] or [owner.task_name]
        for option in spelled:
            assert option in task_options, f"task {name} lacks {option!r}"
        if owner.request:
            assert owner.name in api, f"Launcher.{name} lacks the keyword {owner.name!r}"


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_nothing_is_declared_that_the_cli_lacks_and_the_api_takes_nothing_else(name: str) -> None:
    cli_names = {p.name for p in _cli_params(name)}
    for param in COMMANDS[name].params:
        for cli_name in param.cli_names:
            assert cli_name in cli_names, f"{name}: {cli_name!r} is declared, not a CLI option"
    api = set(inspect.signature(getattr(Launcher, name)).parameters) - {"self"}
    requested = {p.name for p in COMMANDS[name].params if p.request}
    assert api - API_EXTRAS == requested


def test_cli_only_entries_name_real_options_and_say_why() -> None:
    for (name, option), why in CLI_ONLY.items():
        assert option in {p.name for p in _cli_params(name)} and why.strip()


def test_a_task_for_every_declared_command_with_target_and_inventory_first() -> None:
    for name in COMMANDS:
        options = _task_options(name)
        assert options[:2] == ["target", "inventory"], name  # -t and -i as for the CLI


def test_task_values_are_checked_with_the_cli_types() -> None:
    verify = COMMANDS["verify"]
    overrides = verify.request({"wait": "3m", "successes": "2", "interval": "2s"})
    assert (overrides.wait, overrides.successes, overrides.interval) == (180.0, 2, 2.0)
    for bad in ({"wait": "-5"}, {"successes": "abc"}, {"interval": "0"}, {"wait": True}):
        with pytest.raises(UsageError) as caught:
            verify.request(bad)
        assert caught.value.exit_code == ExitCode.USAGE
    with pytest.raises(UsageError, match="unknown argument"):
        verify.request({"grace": 3})


def test_deploy_request_from_the_declaration() -> None:
    options = COMMANDS["deploy"].request(
        {"env": ["LR=3e-4", "EMPTY="], "sets": ("verify.wait=60",), "checkpoints": "keep"}
    )
    assert options.env == {"LR": "3e-4", "EMPTY": ""}
    assert options.sets == ("verify.wait=60",) and options.checkpoint_mode == "keep"
    assert options.wait_lock == 0.0 and not options.restart
    for bad in (
        {"env": ["NOEQUALS"]},
        {"env": "A=1"},
        {"checkpoints": "shred"},
        {"wait_lock": "2d"},
    ):
        with pytest.raises(UsageError):
            COMMANDS["deploy"].request(bad)


def _run_task(name: str, **given: Any) -> int:
    task = getattr(tasks, name)
    defaults = {
        p.name: p.default for p in inspect.signature(task.body).parameters.values() if p.name != "c"
    }
    try:
        task.body(None, **{**defaults, **given})
    except Exit as done:
        return int(done.code)
    return 0


def test_a_task_exits_2_on_bad_input_before_reading_the_inventory(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = str(tmp_path / "nope.yaml")
    assert _run_task("verify", inventory=missing, wait="soon") == 2
    assert "wait='soon'" in capsys.readouterr().err
    assert _run_task("status", inventory=missing) == 2
    assert "nope.yaml" in capsys.readouterr().err
    assert _run_task("logs", inventory=missing, tail="abc") == 2


def test_the_tasks_spell_a_choice_as_the_clis_flags(capsys: pytest.CaptureFixture[str]) -> None:
    options = _task_options("deploy")
    assert "purge_checkpoints" in options and "keep_checkpoints" in options
    assert "checkpoints" not in options
    both = {"purge_checkpoints": True, "keep_checkpoints": True}
    assert _run_task("deploy", inventory="/nonexistent/inventory.yaml", **both) == 2
    assert "exclude each other" in capsys.readouterr().err
