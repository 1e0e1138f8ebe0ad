"""Quoting is done once, by code: any argv reaches `pct` unchanged through a real host shell."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.container.pct import exec_command, push_command

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


def test_push_streams_stdin_through_a_host_temp_file(tmp_path: Path) -> None:
    """The push command: stdin to a private temp file, `pct push` of it, the temp file removed."""
    folder = tmp_path / "bin"
    folder.mkdir()
    pct = folder / "pct"
    # Prints its argv NUL-separated, then a copy of the file it was asked to push.
    pct.write_text('#!/bin/sh\nfor a in "$@"; do printf "%s\\0" "$a"; done; cat "$3"\n')
    pct.chmod(0o755)
    hostile = "/root/it's here; $(touch /tmp/pwned).py"
    env = {**os.environ, "PATH": f"{folder}:{os.environ['PATH']}"}
    command = push_command(200, hostile, perms="0644")
    out = subprocess.run(
        ["bash", "-c", command], input=b"payload\n", env=env, capture_output=True, check=True
    ).stdout
    *argv, content = out.split(b"\0")
    assert [a.decode() for a in argv[:3]] == ["push", "200", argv[2].decode()]
    host_tmp = argv[2].decode()
    assert host_tmp.startswith("/tmp/.launcher-")
    assert [a.decode() for a in argv[3:]] == [hostile, "--perms", "0644"]
    assert content == b"payload\n"
    assert not Path(host_tmp).exists(), "the host temp file must be removed"
    assert not Path("/tmp/pwned").exists()


def test_push_failure_still_removes_the_temp_file(tmp_path: Path) -> None:
    folder = tmp_path / "bin"
    folder.mkdir()
    (folder / "pct").write_text('#!/bin/sh\necho "$3" > "$LOG"; exit 5\n')
    (folder / "pct").chmod(0o755)
    log = tmp_path / "log"
    env = {**os.environ, "PATH": f"{folder}:{os.environ['PATH']}", "LOG": str(log)}
    result = subprocess.run(
        ["bash", "-c", push_command(200, "/root/x.py", perms="0644")],
        input=b"x",
        env=env,
        capture_output=True,
        check=False,
    )
    assert result.returncode == 5
    assert not Path(log.read_text().strip()).exists()
