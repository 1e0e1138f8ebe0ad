"""Quoting is done once, by code: any argv reaches `pct` unchanged through a real host shell."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.container import exec_command, push_command

HOSTILE = [
    "plain",
    "with space",
    "it's",
    'say "hi"',
    "$(touch /tmp/pwned)",
    "`id`",
    "a; rm -rf /",
    "line\nbreak",
    "-n",
    "--",
    "*",
    "~root",
    "",
    "back\\slash",
    "tab\there",
    "ünïcødé",
]

# Any text but NUL, which no argv can carry (and exec_command refuses).
ARG = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=40)


@pytest.fixture(scope="module")
def fake_pct(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A `pct` that prints its argv NUL-separated, so the host shell's parse can be checked."""
    folder = tmp_path_factory.mktemp("bin")
    script = folder / "pct"
    script.write_text('#!/bin/sh\nfor a in "$@"; do printf "%s\\0" "$a"; done\n')
    script.chmod(0o755)
    return folder


def through_shell(command: str, folder: Path) -> list[str]:
    env = {**os.environ, "PATH": f"{folder}:{os.environ['PATH']}"}
    out = subprocess.run(["bash", "-c", command], env=env, capture_output=True, check=True).stdout
    return out.decode().split("\0")[:-1]


def test_hostile_arguments_round_trip(fake_pct: Path) -> None:
    got = through_shell(exec_command(200, ["printf", *HOSTILE]), fake_pct)
    assert got == ["exec", "200", "--", "printf", *HOSTILE]
    assert not Path("/tmp/pwned").exists()


@settings(max_examples=150, deadline=None)
@given(st.lists(ARG, min_size=1, max_size=6))
def test_any_argv_round_trips(fake_pct: Path, argv: list[str]) -> None:
    assert through_shell(exec_command(201, argv), fake_pct) == ["exec", "201", "--", *argv]


@given(st.lists(ARG, min_size=1, max_size=6))
def test_command_is_one_shlex_join(argv: list[str]) -> None:
    assert shlex.split(exec_command(7, argv)) == ["pct", "exec", "7", "--", *argv]


def test_nul_is_refused() -> None:
    with pytest.raises(ValueError, match="NUL"):
        exec_command(200, ["a\x00b"])


def test_push_command_quotes_paths() -> None:
    cmd = push_command(200, "/tmp/x y", "/root/it's here.py", perms="0644")
    assert shlex.split(cmd) == [
        "pct",
        "push",
        "200",
        "/tmp/x y",
        "/root/it's here.py",
        "--perms",
        "0644",
    ]
