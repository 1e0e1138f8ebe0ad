"""What the declarations promise: every value is checked with the CLI's own types wherever it
comes from (a UsageError naming the argument, exit code 2), a task's options are the CLI's, and
the API's keywords (written out, for its readers and type checkers) are its request's."""

from __future__ import annotations

import inspect
import typing
from pathlib import Path
from typing import Any

import pytest
from invoke.exceptions import Exit

from launcher import tasks
from launcher.api import Launcher
from launcher.apijobs import Jobs
from launcher.cli.main import cli, main
from launcher.commands.table import COMMANDS
from launcher.core.declare import parameters
from launcher.core.errors import ExitCode, UsageError
from tests.unit.projectfiles import write_project

# The CLI's options that every command shares, as the tasks spell them.
GLOBAL_OPTIONS = {"target", "inventory", "known_hosts", "identity", "quiet", "debug"}
FLEET_OPTIONS = {"all", "parallel"}
# Keywords of the API that are not a request's: the target, callbacks, the API's own choices.
API_EXTRAS = {"target", "name", "on_step", "on_line", "check", "on_event", "stop"}


def _task_options(name: str) -> list[str]:
    task = getattr(tasks, name)
    return [p for p in inspect.signature(task.body).parameters if p != "c"]


@pytest.mark.parametrize("name", sorted(tasks.TASKS))
def test_a_tasks_options_are_the_clis(name: str) -> None:
    command = cli.commands[name]
    spelled = {
        next(o for o in p.opts if o.startswith("--"))[2:].replace("-", "_")
        for p in command.params
        if p.name != "help"
    }
    assert set(_task_options(name)) == spelled
    first = ["target", "inventory"] if "target" in spelled else ["inventory"]
    assert _task_options(name)[: len(first)] == first  # -t and -i as for the CLI


def _api_method(name: str) -> Any:
    group, _, command = name.rpartition(" ")
    return getattr(Jobs if group else Launcher, command)


@pytest.mark.parametrize("name", sorted(n for n in COMMANDS if hasattr(Launcher, n) or " " in n))
def test_the_apis_keywords_and_defaults_are_its_requests(name: str) -> None:
    """A method's keywords are its request's, and what it passes when none is given builds
    the request the declaration's defaults build."""
    command = COMMANDS[name]
    method = _api_method(name)
    signature = inspect.signature(method).parameters
    keywords = {
        p.name: p.default
        for p in signature.values()
        if p.name not in API_EXTRAS and p.kind is not p.VAR_KEYWORD
    }
    keywords.pop("self", None)
    # `**probe: Unpack[ProbeKeywords]`: a shared keyword set, each name unset by default
    shared = {
        key
        for p in signature.values()
        if p.kind is p.VAR_KEYWORD
        for key in typing.get_args(eval(p.annotation, vars(inspect.getmodule(method))))[
            0
        ].__annotations__
    }
    if "names" in signature:  # job status: the jobs are its positional arguments
        keywords = {}
    wanted = {p.keyword for p in parameters(command.request_type) if p.option.api}
    assert set(keywords) | shared == wanted - {"name", "names"}
    named = {"name": "train"} if "name" in wanted else {}
    assert command.request({**keywords, **named}) == command.request(named)


def test_the_api_refuses_a_bad_value_naming_the_argument(tmp_path: Path) -> None:
    with Launcher(write_project(tmp_path)) as launcher:
        for call, named in (
            (lambda: launcher.verify("prod", wait=-5), "wait=-5"),
            (lambda: launcher.verify("prod", interval=0), "interval=0"),
            (lambda: launcher.verify("prod", wait=float("nan")), "wait=nan"),
            (lambda: launcher.logs("prod", tail="5"), "tail='5'"),
            (lambda: launcher.deploy("prod", checkpoints="shred"), "checkpoints='shred'"),
        ):
            with pytest.raises(UsageError) as caught:
                call()
            assert caught.value.exit_code == ExitCode.USAGE
            assert named in caught.value.message


def test_task_values_are_checked_with_the_cli_types() -> None:
    verify = COMMANDS["verify"]
    overrides = verify.request({"wait": "3m", "successes": "2", "interval": "2s"}, text=True)
    assert (overrides.wait, overrides.successes, overrides.interval) == (180.0, 2, 2.0)
    for bad in ({"wait": "-5"}, {"successes": "abc"}, {"interval": "0"}, {"wait": True}):
        with pytest.raises(UsageError) as caught:
            verify.request(bad, text=True)
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
    assert COMMANDS["deploy"].request({"wait_lock": None}).wait_lock == 0.0
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


def test_the_cli_refuses_both_checkpoint_flags(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["deploy"], ["job", "deploy", "train"]):
        with pytest.raises(SystemExit) as done:
            main(["-i", "/nonexistent.yaml", *argv, "--purge-checkpoints", "--keep-checkpoints"])
        assert done.value.code == ExitCode.USAGE
        assert "--purge-checkpoints and --keep-checkpoints exclude each other" in (
            capsys.readouterr().err
        )


def test_a_shared_keyword_set_refuses_a_name_it_does_not_hold(tmp_path: Path) -> None:
    """`**probe: Unpack[ProbeKeywords]` takes only its own names, as a written-out signature
    would: a misspelt setting is a TypeError naming it, never a setting silently unset."""
    with Launcher(write_project(tmp_path)) as launcher:
        with pytest.raises(TypeError, match="'wiat'"):
            launcher.verify("prod", wiat=3)  # type: ignore[call-arg]
        with pytest.raises(TypeError, match="'grace'"):
            launcher.watch("prod", grace=3)  # type: ignore[call-arg]
        with pytest.raises(TypeError, match="'wait'"):
            launcher.jobs.watch("train", wait=3)  # type: ignore[call-arg]
