"""Hostile input: bad numbers, alias bombs, deep nesting, huge or odd files, system workdirs.

Every case ends in exit 2 with one line naming the file (and line and key where there is one),
quickly, before any connection: never a traceback, never a hang.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

import pytest

from launcher.cli.main import main
from launcher.config.models import load_inventory, load_playbook, parse_jump
from launcher.config.yamlsource import load_yaml
from launcher.core.errors import ConfigError
from launcher.core.params import GRACE, INTERVAL, WAIT, Duration, human, parse_duration
from tests.unit.projectfiles import write_project


class Hang(BaseException):
    """Not an Exception: no handler in the code under test may take it for a bad value."""


@contextlib.contextmanager
def deadline(seconds: float = 5.0) -> Iterator[None]:
    """Fail a step that takes far too long (a hang) instead of blocking the test run."""

    def expire(_signum: int, _frame: FrameType | None) -> None:
        raise Hang(f"no answer within {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    write_project(tmp_path)
    return tmp_path


def run(*argv: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_info, deadline():
        main(list(argv))
    out, err = capsys.readouterr()
    return int(exit_info.value.code or 0), out, err


def check(project: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    return run("-i", str(project / "inventory.yaml"), "inventory", "check", capsys=capsys)


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new, 1))


# --- numbers in the inventory and the playbook ---------------------------------------------


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        (
            "connect_timeout: 10",
            "connect_timeout: 10\n    command_timeout: .inf",
            "inventory.yaml:8: hosts.pve.command_timeout: Input should be a finite number "
            "(got .inf)",
        ),
        (
            "connect_timeout: 10",
            "connect_timeout: .nan",
            "inventory.yaml:7: hosts.pve.connect_timeout: Input should be a finite number "
            "(got .nan)",
        ),
        (
            "connect_timeout: 10",
            "connect_timeout: true",
            "inventory.yaml:7: hosts.pve.connect_timeout: Input should be a valid number "
            "(got true)",
        ),
        (
            "connect_timeout: 10",
            "connect_timeout: '10'",
            "inventory.yaml:7: hosts.pve.connect_timeout: Input should be a valid number "
            "(got '10')",
        ),
        (
            "connect_timeout: 10",
            "connect_timeout: 10\n    command_timeout: 86401",
            "inventory.yaml:8: hosts.pve.command_timeout: Input should be less than or equal "
            "to 86400 (got 86401)",
        ),
        (
            "connect_timeout: 10",
            "connect_timeout: 0",
            "inventory.yaml:7: hosts.pve.connect_timeout: Input should be greater than 0 (got 0)",
        ),
        (
            "    port: 22\n",
            "    port: 70000\n",
            "inventory.yaml:5: hosts.pve.port: Input should be less than or equal to 65535 "
            "(got 70000)",
        ),
        (
            "    port: 22\n",
            "    port: 0\n",
            "inventory.yaml:5: hosts.pve.port: Input should be greater than or equal to 1 (got 0)",
        ),
        (
            "    port: 22\n",
            "    port: 22\n    jump: bastion:notaport\n",
            "inventory.yaml:6: hosts.pve.jump: port must be a number from 1 to 65535 "
            "(got 'notaport')",
        ),
        (
            "    port: 22\n",
            "    port: 22\n    jump: admin@bastion:70000\n",
            "inventory.yaml:6: hosts.pve.jump: port must be a number from 1 to 65535 (got '70000')",
        ),
        (
            "    port: 22\n",
            "    port: 22\n    jump: a:22,,b:22\n",
            "inventory.yaml:6: hosts.pve.jump: must be [user@]host[:port] (got '')",
        ),
        (
            "vmid: 201",
            "vmid: 1000000000",
            "inventory.yaml:10: targets.staging.vmid: Input should be less than or equal to "
            "999999999 (got 1000000000)",
        ),
    ],
)
def test_inventory_numbers_are_finite_and_in_range(
    project: Path, capsys: pytest.CaptureFixture[str], old: str, new: str, expected: str
) -> None:
    edit(project / "inventory.yaml", old, new)
    code, out, err = check(project, capsys)
    assert (code, out) == (2, "")
    assert err == f"error: {project}/{expected}\n"


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        (
            "stop_grace: 5",
            "stop_grace: .inf",
            "dflash.yaml:11: stop_grace: Input should be a finite number (got .inf)",
        ),
        (
            "stop_grace: 5",
            "stop_grace: 3601",
            "dflash.yaml:11: stop_grace: Input should be less than or equal to 3600 (got 3601)",
        ),
        (
            "stop_grace: 5",
            "stop_grace: -5",
            "dflash.yaml:11: stop_grace: Input should be greater than or equal to 0 (got -5)",
        ),
        (
            "gpus: 8",
            "gpus: true",
            "dflash.yaml:10: gpus: Input should be a valid integer (got true)",
        ),
        (
            "verify: {wait: 180, interval: 10}",
            "verify: {wait: .inf, interval: 10}",
            "dflash.yaml:12: verify.wait: Input should be a finite number (got .inf)",
        ),
        (
            "verify: {wait: 180, interval: 10}",
            "verify: {wait: 180, interval: 0}",
            "dflash.yaml:12: verify.interval: Input should be greater than or equal to 0.2 (got 0)",
        ),
        (
            "verify: {wait: 180, interval: 10}",
            "verify: {wait: 180, interval: 10, window: 1.0e+9}",
            "dflash.yaml:12: verify.window: Input should be less than or equal to 604800 "
            "(got 1000000000.0)",
        ),
        (
            "verify: {wait: 180, interval: 10}",
            "verify: {wait: 180, interval: 10, step: {stall_after: .inf}}",
            "dflash.yaml:12: verify.step.stall_after: Input should be a finite number (got .inf)",
        ),
        (
            "verify: {wait: 180, interval: 10}",
            "verify: {wait: 180, interval: 10, step: {stall_after: 10, hang_after: 30}}",
            "dflash.yaml:12: verify.step: hang_after (30 s) must be at most stall_after (10 s): "
            "a step unchanged for stall_after is a stall anyway",
        ),
        (
            "verify: {wait: 180, interval: 10}",
            "verify: {wait: 180, interval: 10, throughput: {min: .nan}}",
            "dflash.yaml:12: verify.throughput.min: Input should be a finite number (got .nan)",
        ),
        (
            "verify: {wait: 180, interval: 10}",
            "verify: {wait: 180, interval: 10, queues: {q_pre: true}}",
            "dflash.yaml:12: verify.queues.q_pre: Input should be a valid integer or "
            "{buckets: N, min_fill: F} (got true)",
        ),
    ],
)
def test_playbook_numbers_are_finite_and_in_range(
    project: Path, capsys: pytest.CaptureFixture[str], old: str, new: str, expected: str
) -> None:
    edit(project / "playbooks" / "dflash.yaml", old, new)
    code, _, err = check(project, capsys)
    assert code == 2
    # Both targets share the playbook, so the problem is reported for each of them.
    assert err == f"error: {project}/playbooks/{expected}\n{project}/playbooks/{expected}\n"


def test_accepted_jump_forms() -> None:
    assert parse_jump("bastion") == (None, "bastion", 22)
    assert parse_jump("admin@bastion:2200") == ("admin", "bastion", 2200)
    assert parse_jump("[fd00::1]:2222") == (None, "fd00::1", 2222)
    for bad in ("bastion:", "@bastion", "host:0", "host:+22", "fd00::1", "ssh://host"):
        with pytest.raises(ValueError):
            parse_jump(bad)


# --- workdir -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "workdir",
    [
        "//",
        "///",
        "/./",
        "/etc",
        "//etc",
        "///usr",
        "/var/",
        "/proc/1",
        "/sys/fs/x",
        "/home",
        "/tmp",
    ],
)
def test_system_workdirs_are_refused(
    project: Path, capsys: pytest.CaptureFixture[str], workdir: str
) -> None:
    edit(project / "playbooks" / "dflash.yaml", "workdir: /root/dflash", f"workdir: '{workdir}'")
    code, _, err = check(project, capsys)
    assert code == 2
    first = err.splitlines()[0]
    assert first.startswith(f"error: {project}/playbooks/dflash.yaml:3: workdir: "), first
    assert "must be a directory below /" in first or "system directory" in first


@pytest.mark.parametrize(
    ("workdir", "normal"),
    [
        ("//root/run", "/root/run"),
        ("///srv/x/", "/srv/x"),
        ("/home/ann/run", "/home/ann/run"),
        ("/opt/train", "/opt/train"),
        ("/data", "/data"),
        ("/workspace/a", "/workspace/a"),
        ("/tmp/run", "/tmp/run"),
        ("/mnt/scratch", "/mnt/scratch"),
        ("/var/lib/train", "/var/lib/train"),
    ],
)
def test_workdirs_normalise(tmp_path: Path, workdir: str, normal: str) -> None:
    write_project(tmp_path)
    edit(tmp_path / "playbooks" / "dflash.yaml", "workdir: /root/dflash", f"workdir: '{workdir}'")
    playbook = load_playbook(tmp_path / "playbooks" / "dflash.yaml")
    assert playbook.spec.workdir == normal
    assert playbook.checkpoints_path == f"{normal}/checkpoints"


# --- YAML limits -------------------------------------------------------------------------


def timed_error(path: Path) -> tuple[str, float]:
    started = time.monotonic()
    with pytest.raises(ConfigError) as error, deadline():
        load_yaml(path, what="playbook")
    return str(error.value), time.monotonic() - started


def test_depth_limit(tmp_path: Path) -> None:
    path = tmp_path / "deep.yaml"
    path.write_text("a: " + "[" * 200 + "]" * 200 + "\n")
    message, _ = timed_error(path)
    # The mapping, 63 lists: the 64th list is one level too many.
    assert message == f"{path}:1:67: playbook refused: nested more than 64 levels deep"


def test_depth_within_the_limit_loads(tmp_path: Path) -> None:
    # Levels: the top mapping, 62 lists, the scalar.
    path = tmp_path / "ok.yaml"
    path.write_text("a: " + "[" * 62 + "1" + "]" * 62 + "\n")
    document = load_yaml(path, what="playbook")
    value = document.data["a"]
    for _ in range(62):
        (value,) = value
    assert value == 1
    path.write_text("a: " + "[" * 63 + "1" + "]" * 63 + "\n")
    message, _ = timed_error(path)
    assert message == f"{path}:1:67: playbook refused: nested more than 64 levels deep"


def test_depth_counts_what_aliases_stand_for(tmp_path: Path) -> None:
    # Each line is shallow, but every alias adds its anchor's depth: 31, 61, then 91 levels.
    lines = ["a0: &a0 " + "[" * 30 + "1" + "]" * 30]
    lines += [f"a{i}: &a{i} " + "[" * 30 + f"*a{i - 1}" + "]" * 30 for i in range(1, 4)]
    path = tmp_path / "chain.yaml"
    path.write_text("\n".join(lines) + "\n")
    message, _ = timed_error(path)
    assert message == (
        f"{path}:3:39: playbook refused: alias *a1 nests the document more than 64 levels deep"
    )


def test_too_many_aliases(tmp_path: Path) -> None:
    path = tmp_path / "aliases.yaml"
    path.write_text("x: &x 1\nl: [" + ", ".join(["*x"] * 101) + "]\n")
    message, _ = timed_error(path)
    assert message.startswith(f"{path}:2:")
    assert message.endswith("playbook refused: more than 100 aliases (*name)")


def test_a_cyclic_alias_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "cycle.yaml"
    path.write_text("a: &a [1, *a]\n")
    message, _ = timed_error(path)
    assert (
        message
        == f"{path}:1:11: playbook refused: alias *a is inside the value it refers to (a cycle)"
    )


def test_merge_keys_still_work_and_lines_point_at_what_was_written(tmp_path: Path) -> None:
    path = tmp_path / "merge.yaml"
    path.write_text("base: &b {x: 1, y: 2}\nc:\n  <<: *b\n  y: 3\n")
    document = load_yaml(path, what="playbook")
    assert document.data["c"] == {"x": 1, "y": 3}
    assert document.line_of(["c", "y"]) == 4


def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    path = tmp_path / "fifo.yaml"
    os.mkfifo(path)  # opening it for reading would wait for a writer forever
    message, _ = timed_error(path)
    assert message == f"{path}: playbook is not a regular file"


def test_a_directory_and_bad_encoding(tmp_path: Path) -> None:
    message, _ = timed_error(tmp_path)
    assert message == f"{tmp_path}: playbook is not a regular file"
    path = tmp_path / "latin1.yaml"
    path.write_bytes(b"name: caf\xe9\n")
    message, _ = timed_error(path)
    assert (
        message
        == f"{path}: cannot read playbook: not UTF-8 text (invalid continuation byte at byte 9)"
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "a: 2024-13-01\n",
            ":1:4: YAML syntax error: cannot read this value: month must be in 1..12",
        ),
        ("a: !!int x\n", ":1:4: YAML syntax error: cannot read this value: invalid literal"),
        ("a: " + "1" * 5000 + "\n", ":1:4: YAML syntax error: cannot read this value: Exceeds"),
        (
            "a: 1\n---\nb: 2\n",
            ":2:1: YAML syntax error: expected a single document in the stream, "
            "but found another document",
        ),
    ],
)
def test_values_yaml_cannot_build_are_config_errors(
    tmp_path: Path, text: str, expected: str
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    message, _ = timed_error(path)
    assert message.startswith(f"{path}{expected}"), message


# --- the script source ---------------------------------------------------------------------


def test_a_script_symlink_loop_is_a_config_error(project: Path) -> None:
    loop = project / "playbooks" / "loop.py"
    loop.symlink_to(loop)
    edit(project / "playbooks" / "dflash.yaml", "source: train.py", "source: loop.py")
    with pytest.raises(ConfigError) as error:
        load_inventory(project / "inventory.yaml").target("prod")
    assert str(error.value).startswith(f"{project}/playbooks/dflash.yaml:5: script.source: ")


# --- numbers on the command line -------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "option", "message"),
    [
        (["deploy", "--grace", "inf"], "--grace", "'inf' is not a duration"),
        (["deploy", "--grace", "nan"], "--grace", "'nan' is not a duration"),
        (["deploy", "--grace", "-5"], "--grace", "-5 is out of range: 0 s to 1 h"),
        (["deploy", "--restart", "--grace", "2h"], "--grace", "2h is out of range: 0 s to 1 h"),
        (["stop", "--grace", "1e999"], "--grace", "'1e999' is not a duration"),
        (["rollback", "--grace", "3601"], "--grace", "3601 is out of range: 0 s to 1 h"),
        (["verify", "--wait", "-1"], "--wait", "-1 is out of range: 0 s to 7 days"),
        (["verify", "--wait", "nan"], "--wait", "'nan' is not a duration"),
        (["verify", "--wait", "inf"], "--wait", "'inf' is not a duration"),
        (["verify", "--wait", "8d"], "--wait", "8d is out of range: 0 s to 7 days"),
        (["verify", "--interval", "0"], "--interval", "0 is out of range: 0.2 s to 1 h"),
        (["smoke", "--window", "1w"], "--window", "'1w' is not a duration"),
        (["verify", "--successes", "0"], "--successes", "0 is not in the range 1<=x<=1000"),
        (["logs", "--tail", "-1"], "--tail", "-1 is not in the range 0<=x<=1000000"),
        (["history", "--limit", "10000000"], "--limit", "10000000 is not in the range"),
        (["status", "--parallel", "0"], "--parallel", "0 is not in the range 1<=x<=256"),
        (["doctor", "--parallel", "nan"], "--parallel", "'nan' is not a valid integer"),
    ],
)
def test_bad_numbers_exit_2_before_the_inventory_is_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], option: str, message: str
) -> None:
    # The inventory does not exist: reaching it would say so instead.
    code, out, err = run("-i", str(tmp_path / "missing.yaml"), *args, capsys=capsys)
    assert (code, out) == (2, "")
    assert f"Invalid value for '{option}'" in err
    assert message in err
    assert "Traceback" not in err and "inventory file not found" not in err


@pytest.mark.parametrize(
    "args",
    [
        ["verify", "--wait", "3m", "--interval", "0.2", "--window", "1h"],
        ["smoke", "--wait", "90s", "--interval", "2s", "--window", "7d", "--successes", "1000"],
        ["deploy", "--grace", "1h"],
        ["stop", "--grace", "0"],
        ["rollback", "--grace", "1.5m"],
    ],
)
def test_good_numbers_reach_the_inventory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str]
) -> None:
    code, _, err = run("-i", str(tmp_path / "missing.yaml"), *args, capsys=capsys)
    assert code == 2
    assert err.startswith(f"error: {tmp_path / 'missing.yaml'}: inventory file not found\nhint: ")


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90", 90.0),
        ("90s", 90.0),
        ("1.5", 1.5),
        (".5", 0.5),
        ("3m", 180.0),
        ("1.5m", 90.0),
        ("1h", 3600.0),
        ("2d", 172800.0),
        (" 7 s ", 7.0),
        ("-5", -5.0),
    ],
)
def test_duration_syntax(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    "text", ["", "nan", "inf", "-inf", "1e3", "1h30m", "5 min", "3M", "0x10", "1_000", "s"]
)
def test_not_durations(text: str) -> None:
    assert parse_duration(text) is None


def test_duration_ranges() -> None:
    assert (GRACE.low, GRACE.high) == (0, 3600)
    assert (WAIT.low, WAIT.high) == (0, 7 * 86400)
    assert (INTERVAL.low, INTERVAL.high) == (0.2, 3600)
    assert [human(s) for s in (0, 0.2, 90, 120, 3600, 86400, 604800)] == [
        "0 s",
        "0.2 s",
        "90 s",
        "2 min",
        "1 h",
        "1 day",
        "7 days",
    ]
    assert Duration(1, 2).convert(1.5, None, None) == 1.5  # a default that is already a number
