"""The run's command read before the stop (launcher/agent/commandcheck.py): which program, which
script or module, where; files only (no process is started for these cases)."""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.agent.commandcheck import (
    CommandCheck,
    program_and_args,
    script_of,
    simple_words,
)


@pytest.mark.parametrize(
    ("command", "script"),
    [
        ("python3 train.py --lr 3e-4", ("file", "train.py")),
        ("python3 -u -W ignore train.py", ("file", "train.py")),
        ("python3 -m pkg.train --x 1", ("module", "pkg.train")),
        ("python3 -mpkg", ("module", "pkg")),
        ("python3 -c 'print(1)'", None),
        ("bash -e run.sh", ("file", "run.sh")),
        ("bash -lc 'make train'", None),
        ("torchrun --nproc_per_node 8 --nnodes=1 train.py --bs 4", ("file", "train.py")),
        ("torchrun --nproc_per_node=2 -m trainer", ("module", "trainer")),
        ("accelerate launch --config_file cfg.yaml train.py", ("file", "train.py")),
        ("uv run x.py", ("file", "x.py")),
        ("uv run python sub/x.py", ("file", "sub/x.py")),
        ("OMP_NUM_THREADS=4 exec env -u DISPLAY NCCL_DEBUG=INFO python3 t.py", ("file", "t.py")),
        ("nohup /usr/bin/python3.11 t.py", ("file", "t.py")),
        ("./run.sh --fast", None),  # a program of its own: found or not, no script to look for
    ],
)
def test_the_script_a_command_runs(command: str, script: tuple[str, str] | None) -> None:
    words = simple_words(command)
    assert words is not None
    program, args = program_and_args(words)
    assert program is not None
    assert script_of(program, args) == script


@pytest.mark.parametrize(
    "command",
    [
        "cd sub && python3 x.py",
        "python3 x.py | tee log",
        "python3 x.py > log 2>&1",
        "python3 $SCRIPT",
        'python3 "$HOME/x.py"',
        "python3 ~/x.py",
        "python3 x*.py",
        "(python3 x.py)",
        "python3 'unclosed",
    ],
)
def test_shell_syntax_is_left_to_the_dry_start(command: str) -> None:
    assert simple_words(command) is None


def ready(tmp_path: Path) -> CommandCheck:
    (tmp_path / "bin").mkdir()
    for name in ("python3", "torchrun"):
        (tmp_path / "bin" / name).write_text("#!/bin/sh\n")
        (tmp_path / "bin" / name).chmod(0o755)
    (tmp_path / "train.py").write_text("")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "train.py").write_text("")
    return CommandCheck(str(tmp_path), {}, [str(tmp_path / "new.py")], {"PATH": f"{tmp_path}/bin"})


def test_a_typo_in_the_script_names_the_file_and_the_command(tmp_path: Path) -> None:
    check = ready(tmp_path)
    assert check.problem("python3 train.py") is None
    assert check.problem("python3 trian.py") == (
        f"the command's script trian.py does not exist ({tmp_path}/trian.py); "
        "command: python3 trian.py"
    )


def test_a_typo_in_the_program_names_the_path_searched(tmp_path: Path) -> None:
    assert ready(tmp_path).problem("pyhton3 train.py") == (
        f"the command's program pyhton3 is not found on the run's PATH ({tmp_path}/bin); "
        "command: pyhton3 train.py"
    )


def test_a_script_the_deploy_installs_counts_as_there(tmp_path: Path) -> None:
    assert ready(tmp_path).problem("python3 new.py") is None


def test_a_module_of_a_local_package(tmp_path: Path) -> None:
    check = ready(tmp_path)
    assert check.problem("torchrun --nproc_per_node 2 -m pkg.train") is None
    assert check.problem("python3 -m pkg.trian") == (
        f"the command's module pkg.trian does not exist in {tmp_path}; "
        "command: python3 -m pkg.trian"
    )


def test_builtins_are_not_looked_up(tmp_path: Path) -> None:
    assert ready(tmp_path).problem("exit 1") is None


def test_the_new_release_is_judged_through_current(tmp_path: Path) -> None:
    """`current` still points at the old release during the checks: paths through it (the
    start directory, an absolute path, a PATH entry) are read in the new one."""
    old, new = tmp_path / "releases" / "old", tmp_path / "releases" / "new"
    for release in (old, new):
        (release / ".venv" / "bin").mkdir(parents=True)
    (old / "train.py").write_text("")  # only the old release has it
    (new / ".venv" / "bin" / "python").write_text("")
    (new / ".venv" / "bin" / "python").chmod(0o755)
    (new / "main.py").write_text("")
    (tmp_path / "current").symlink_to("releases/old")
    link = str(tmp_path / "current")
    check = CommandCheck(link, {link: str(new)}, [], {"PATH": f"{link}/.venv/bin:/usr/bin"})
    assert check.problem(".venv/bin/python main.py") is None
    assert check.problem(f"{link}/.venv/bin/python main.py") is None
    assert check.problem("python main.py") is None  # through PATH
    assert check.problem("python train.py") == (
        f"the command's script train.py does not exist ({new}/train.py); command: python train.py"
    )
