"""Hostile YAML (an alias bomb, deep nesting, a huge file) is refused within a second, with
either parser. The limits' wording and the rest of hostile config:
tests/unit/test_hostile_config.py."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from launcher.config import yamlsource
from launcher.config.yamlsource import MAX_BYTES
from tests.unit import test_hostile_config
from tests.unit.test_hostile_config import check, timed_error

project = test_hostile_config.project  # the fixture: a project's files in tmp_path


# The classic "billion laughs": 9 levels of 9 aliases, about a billion strings once expanded.
LAUGHS = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n' + "".join(
    f"{b}: &{b} [{','.join([f'*{a}'] * 9)}]\n" for a, b in zip("abcdefgh", "bcdefghi", strict=True)
)


def test_billion_laughs_fails_fast_through_the_cli(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    book = project / "playbooks" / "dflash.yaml"
    book.write_text(LAUGHS + book.read_text())
    assert len(LAUGHS) < 720
    started = time.monotonic()
    code, _, err = check(project, capsys)
    elapsed = time.monotonic() - started
    assert code == 2
    assert err.startswith(f"error: {book}:")
    assert "playbook refused: more than 20000 values (aliases expanded)" in err
    assert elapsed < 1.0


def test_lists_nested_1000_deep_are_refused_without_recursion(tmp_path: Path) -> None:
    path = tmp_path / "deep.yaml"
    path.write_text("a: " + "[" * 1000 + "]" * 1000 + "\n")
    message, elapsed = timed_error(path)
    # libyaml has its own limit of 1000; the pure-Python parser reaches launcher's first.
    assert message.startswith(f"{path}:1:"), message
    assert "nested more than 64 levels deep" in message or "maximum nesting depth" in message
    assert elapsed < 1.0


@pytest.mark.parametrize("loader", ["libyaml", "python"])
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (LAUGHS, ":5:11: playbook refused: more than 20000 values (aliases expanded)"),
        ("a: " + "[" * 200 + "]" * 200, ":1:67: playbook refused: nested more than 64 levels deep"),
        ("x: &x 1\nl: [" + ", ".join(["*x"] * 101) + "]\n", ":2:"),
        ("a: &a [1, *a]\n", ":1:11: playbook refused: alias *a is inside the value it refers to"),
        ("a: 1\nb: éé\x07\n", ":2:6: YAML syntax error: unacceptable character #x0007: "),
        ("a: !!timestamp\n", ":1:4: YAML syntax error: cannot read this value: "),
    ],
)
def test_limits_hold_with_either_parser(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, loader: str, text: str, expected: str
) -> None:
    # PyYAML built without libyaml falls back to the pure-Python parser: same limits.
    if loader == "python":
        monkeypatch.setattr(yamlsource, "_Loader", yamlsource._PyLoader)
    path = tmp_path / "hostile.yaml"
    path.write_text(text)
    message, elapsed = timed_error(path)
    assert message.startswith(f"{path}{expected}"), message
    assert elapsed < 1.0


def test_a_huge_file_is_refused_before_it_is_read(tmp_path: Path) -> None:
    path = tmp_path / "huge.yaml"
    with path.open("wb") as handle:
        handle.truncate(100 * 2**20)  # sparse: 100 MB of NULs, no disk used
    message, elapsed = timed_error(path)
    assert message == f"{path}: playbook is too large (104857600 bytes; at most {MAX_BYTES}, 1 MiB)"
    assert elapsed < 0.5
