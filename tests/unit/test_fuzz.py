"""Fuzz: random YAML, random bytes and random values for every numeric option.

The only outcomes allowed are success, or exit 2 with a one-line reason: never a traceback
(any exception escaping `main` fails the test), never a hang (each example has a deadline, so a
hang fails the test instead of blocking the suite).
"""

from __future__ import annotations

import contextlib
import io
import math
from pathlib import Path
from typing import Any

import click
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.cli.main import cli, main
from launcher.config.models import load_inventory, load_playbook
from launcher.core.errors import ConfigError
from launcher.core.params import Duration, Number
from tests.unit.projectfiles import INVENTORY, PLAYBOOK, write_project
from tests.unit.test_hostile_config import deadline

# Small example counts keep this file under 20 s on a busy two-core machine.
FUZZ = settings(max_examples=80, deadline=None, database=None)


def run_cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with deadline(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(list(argv))
        except SystemExit as exit_:
            code = exit_.code
        else:  # pragma: no cover - main always exits
            code = 0
    assert isinstance(code, int), code
    return code, out.getvalue(), err.getvalue()


def assert_clean_outcome(code: int, err: str) -> None:
    assert code in (0, 2), (code, err)
    assert "Traceback" not in err, err
    if code == 2:
        assert err.startswith(("error: ", "Usage: ")), err


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("fuzz")
    write_project(path)
    return path


# --- the loaders -------------------------------------------------------------------------

# Pieces that YAML gives meaning to, so random documents reach deeper than random text does.
KEYS = ["a", "b", "hosts", "verify", "wait", "<<", "? a", "- a", "-", "[a", "{a", "&a a", "*a"]
VALUE_TOKENS = [
    "x", "[", "]", "{", "}", ",", "&a ", "*a", "&b ", "*b", "'", '"', "|", ">-", "!!int ",
    "!!float ", "!!str ", "!!binary ", "!!timestamp ", "!!set ", "!!omap ", "!!python/tuple ",
    ".inf", "-.inf", ".nan", "1.0e+400", "0x1F", "0o17", "1_000", "2024-13-01", "2024-02-30",
    "2024-01-01", "12:30:00", "~", "true", "no", "-1", "99999999999999999999", "#", "\\x00",
    "\x00", "\x85", "\ufeff", "é", " ",
]  # fmt: skip
# Whole values that PyYAML's own constructors trip over.
ODD_VALUES = [
    "2024-13-01", "2024-02-30", "!!timestamp", "!!timestamp x", "!!int x", "!!float x",
    "!!binary '@@'", "!!int " + "9" * 5000, "&c [1, *c]", "!!set [1]", "!!omap [1]",
]  # fmt: skip
LINE = st.tuples(
    st.sampled_from(["", "  ", "    ", "\t"]),
    st.sampled_from(KEYS),
    st.sampled_from([": ", ":", " "]),
    st.sampled_from(ODD_VALUES) | st.lists(st.sampled_from(VALUE_TOKENS), max_size=4).map("".join),
).map("".join)
YAMLISH = st.lists(LINE, max_size=12).map("\n".join)
TEXT = st.one_of(YAMLISH, st.text(max_size=300))


@FUZZ
@given(text=TEXT, which=st.sampled_from(["inventory", "playbook"]))
def test_random_yaml_text_gives_a_result_or_a_config_error(
    root: Path, text: str, which: str
) -> None:
    path = root / f"random-{which}.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    with deadline(), contextlib.suppress(ConfigError):
        if which == "inventory":
            load_inventory(path)
        else:
            load_playbook(path)


@FUZZ
@given(data=st.binary(max_size=600))
def test_random_bytes_give_a_result_or_a_config_error(root: Path, data: bytes) -> None:
    path = root / "random.yaml"
    path.write_bytes(data)
    with deadline(), contextlib.suppress(ConfigError):
        load_playbook(path)
    code, _, err = run_cli("-i", str(path), "inventory", "check")
    assert_clean_outcome(code, err)


SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.sampled_from(["3m", "90s", "1h", "//", "/", "/etc", "//x", "..", "host:70000", "a,b"]),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=6,
)
PLAYBOOK_KEYS = [
    ("name",), ("session",), ("workdir",), ("checkpoints",), ("command",), ("gpus",),
    ("stop_grace",), ("keep_archives",), ("buckets",), ("env",), ("env", "X"),
    ("script", "source"), ("script", "dest"), ("verify",), ("verify", "wait"),
    ("verify", "interval"), ("verify", "window"), ("verify", "successes"), ("verify", "lines"),
    ("verify", "queues"), ("verify", "queues", "q_pre"), ("verify", "fail_patterns"),
    ("verify", "throughput", "min"), ("verify", "throughput", "target"),
    ("verify", "step", "stall_after"), ("verify", "loss", "warn_rise"), ("extra",),
]  # fmt: skip
INVENTORY_KEYS = [
    ("hosts", "pve", "address"), ("hosts", "pve", "port"), ("hosts", "pve", "user"),
    ("hosts", "pve", "jump"), ("hosts", "pve", "connect_timeout"),
    ("hosts", "pve", "command_timeout"), ("hosts", "pve", "identity_file"),
    ("hosts", "pve", "max_sessions"), ("hosts", "pve", "host_key_policy"),
    ("targets", "prod", "vmid"),
    ("targets", "prod", "playbook"), ("targets", "prod", "host"), ("default_target",),
    ("groups",), ("groups", "all"), ("targets",), ("hosts",),
]  # fmt: skip

# The documented ranges of the config's numbers: (file, key) -> (low, high, whole numbers only,
# low excluded). The oracle below is written from this table, not from the models.
WEEK = 7 * 86400
NUMBER_KEYS: dict[tuple[str, tuple[str, ...]], tuple[float, float, bool, bool]] = {
    ("inventory", ("hosts", "pve", "port")): (1, 65535, True, False),
    ("inventory", ("hosts", "pve", "connect_timeout")): (0, 600, False, True),
    ("inventory", ("hosts", "pve", "command_timeout")): (0, 86400, False, True),
    ("inventory", ("hosts", "pve", "max_sessions")): (1, 1000, True, False),
    ("inventory", ("targets", "prod", "vmid")): (1, 999_999_999, True, False),
    ("playbook", ("stop_grace",)): (0, 3600, False, False),
    ("playbook", ("gpus",)): (0, 256, True, False),
    ("playbook", ("keep_archives",)): (0, 1000, True, False),
    ("playbook", ("verify", "wait")): (0, WEEK, False, False),
    ("playbook", ("verify", "interval")): (0.2, 3600, False, False),
    ("playbook", ("verify", "window")): (0, WEEK, False, False),
    ("playbook", ("verify", "successes")): (1, 1000, True, False),
    ("playbook", ("verify", "lines")): (10, 100_000, True, False),
    ("playbook", ("verify", "step", "stall_after")): (0, WEEK, False, True),
}
# Numbers that may also be null (unset: keep_archives keeps every archive).
NULLABLE = {("playbook", ("keep_archives",))}


def put(document: dict[str, Any], keys: tuple[str, ...], value: object) -> None:
    for key in keys[:-1]:
        child = document.get(key)
        if not isinstance(child, dict):
            child = document[key] = {}
        document = child
    document[keys[-1]] = value


def write_files(root: Path, edits: list[tuple[tuple[str, tuple[str, ...]], object]]) -> Path:
    files = {"playbook": yaml.safe_load(PLAYBOOK), "inventory": yaml.safe_load(INVENTORY)}
    for (which, keys), value in edits:
        put(files[which], keys, value)
    (root / "playbooks" / "dflash.yaml").write_text(yaml.safe_dump(files["playbook"]))
    (root / "inventory.yaml").write_text(yaml.safe_dump(files["inventory"]))
    return root / "inventory.yaml"


@FUZZ
@given(
    edits=st.lists(
        st.tuples(
            st.sampled_from([("playbook", k) for k in PLAYBOOK_KEYS])
            | st.sampled_from([("inventory", k) for k in INVENTORY_KEYS]),
            VALUES,
        ),
        min_size=1,
        max_size=3,
    )
)
def test_random_values_in_valid_files_pass_or_exit_2(
    root: Path, edits: list[tuple[tuple[str, tuple[str, ...]], object]]
) -> None:
    inventory = write_files(root, edits)
    code, _, err = run_cli("-i", str(inventory), "inventory", "check", "--json")
    assert_clean_outcome(code, err)


NUMBERS = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.integers(min_value=-5, max_value=1_000_000),
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(min_value=-1, max_value=1e6),
    st.booleans(),
    st.sampled_from(["10", "3m", "", None]),
)


@FUZZ
@given(key=st.sampled_from(sorted(NUMBER_KEYS)), value=NUMBERS)
def test_config_numbers_are_refused_exactly_outside_their_range(
    root: Path, key: tuple[str, tuple[str, ...]], value: object
) -> None:
    inventory = write_files(root, [(key, value)])
    code, _, err = run_cli("-i", str(inventory), "inventory", "check")
    low, high, whole, low_open = NUMBER_KEYS[key]
    valid = (value is None and key in NULLABLE) or (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and (isinstance(value, int) or not whole)
        and math.isfinite(value)
        and (value > low if low_open else value >= low)
        and value <= high
    )
    assert code == (0 if valid else 2), (key, value, err)
    if not valid:
        assert f": {'.'.join(key[1])}: " in err, err


# --- numeric options -----------------------------------------------------------------------


def numeric_options() -> list[tuple[list[str], click.Option]]:
    """Every option of every command whose value is a number: (command path, option)."""
    found: list[tuple[list[str], click.Option]] = []

    def walk(command: click.Command, path: list[str]) -> None:
        for param in command.params:
            numeric = isinstance(param.type, Duration | Number | click.types._NumberParamTypeBase)
            if isinstance(param, click.Option) and numeric:
                found.append((path, param))
        if isinstance(command, click.Group):
            for name, sub in command.commands.items():
                walk(sub, [*path, name])

    walk(cli, [])
    return found


NUMERIC = numeric_options()


def test_every_numeric_option_is_bounded() -> None:
    names = {f"{' '.join(path)} {option.opts[0]}" for path, option in NUMERIC}
    assert {"deploy --grace", "stop --grace", "rollback --grace", "verify --wait"} <= names
    assert {"verify --interval", "smoke --window", "logs --tail", "history --limit"} <= names
    for path, option in NUMERIC:
        kind = option.type
        where = f"{' '.join(path)} {option.opts[0]}"
        assert isinstance(kind, Duration | Number | click.IntRange), f"{where}: {kind!r}"
        if isinstance(kind, click.IntRange):
            assert kind.max is not None, f"{where}: no upper bound"


NUMBER_TEXT = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(min_value=-(10**30), max_value=10**30).map(str),
    st.tuples(
        st.integers(min_value=-10, max_value=10**7) | st.floats(min_value=-10, max_value=1e7),
        st.sampled_from(["", "s", "m", "h", "d", "ms", "w", " ", "S"]),
    ).map(lambda pair: f"{pair[0]}{pair[1]}"),
    st.text(max_size=12),
    st.sampled_from(["", " ", "nan", "inf", "-inf", "1e309", "0x10", "١٢", "--", "1_000"]),
)


@settings(max_examples=200, deadline=None, database=None)
@given(index=st.integers(min_value=0, max_value=len(NUMERIC) - 1), value=NUMBER_TEXT)
def test_every_numeric_option_converts_or_says_why(index: int, value: str) -> None:
    """At the type: a finite number in range, or a BadParameter (exit 2). This reaches options
    that the command-line fuzz below must not run for real (sandbox up)."""
    path, option = NUMERIC[index]
    ctx = click.Context(cli)
    try:
        with deadline():
            result = option.type.convert(value, option, ctx)
    except click.BadParameter as error:
        assert error.format_message()
        return
    assert isinstance(result, int | float) and not isinstance(result, bool)
    assert math.isfinite(result)
    kind = option.type
    if isinstance(kind, Duration | Number):
        assert kind.low <= result <= kind.high, (path, value, result)
    elif isinstance(kind, click.IntRange):
        assert kind.min is None or result >= kind.min
        assert kind.max is not None and result <= kind.max


# The commands and options run through `main` against an inventory (or lengths file) that does
# not exist: a value that passes ends in "not found" (exit 2), before any connection.
CLI_OPTIONS: list[tuple[list[str], str]] = [
    (["deploy"], "--grace"),
    (["deploy", "--all"], "--parallel"),
    (["stop"], "--grace"),
    (["rollback"], "--grace"),
    (["verify"], "--wait"),
    (["verify"], "--interval"),
    (["verify"], "--window"),
    (["verify"], "--successes"),
    (["smoke"], "--wait"),
    (["smoke"], "--interval"),
    (["smoke"], "--window"),
    (["status"], "--parallel"),
    (["logs"], "--tail"),
    (["history"], "--limit"),
    (["buckets", "plan", "{missing}"], "--budget"),
    (["buckets", "plan", "{missing}", "--budget", "100"], "--buckets"),
    (["buckets", "plan", "{missing}", "--budget", "100"], "--max-len"),
    (["buckets", "plan", "{missing}", "--budget", "100"], "--sorted-throughput"),
    (["buckets", "plan", "{missing}", "--budget", "100"], "--epochs"),
    (["buckets", "plan", "{missing}", "--budget", "100"], "--seed"),
]


def expected_seconds(value: str) -> float | None:
    """The oracle for plain values: a decimal number with an optional s/m/h/d unit."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    number, unit = (value[:-1], units[value[-1]]) if value[-1:] in units else (value, 1)
    try:
        seconds = float(number) * unit
    except ValueError:
        return None
    digits = number.lstrip("+-").replace(".", "", 1)
    plain = digits.isascii() and digits.isdigit()
    return seconds if plain and math.isfinite(seconds) else None


# The documented ranges of the duration options, in seconds (the oracle, not the code).
DURATION_RANGES = {
    "--grace": (0, 3600),
    "--wait": (0, 7 * 86400),
    "--interval": (0.2, 3600),
    "--window": (0, 7 * 86400),
}


@settings(max_examples=150, deadline=None, database=None)
@given(index=st.integers(min_value=0, max_value=len(CLI_OPTIONS) - 1), value=NUMBER_TEXT)
def test_numeric_options_through_main_exit_2_with_a_message(index: int, value: str) -> None:
    missing = "/nonexistent/launcher-fuzz"
    prefix, name = CLI_OPTIONS[index]
    args = [part.replace("{missing}", missing) for part in prefix]
    code, out, err = run_cli("-i", f"{missing}/inventory.yaml", *args, f"{name}={value}")
    assert code == 2, (code, out, err)
    assert "Traceback" not in err, err
    rejected = f"Invalid value for '{name}'" in err
    reached = "file not found" in err or "cannot read" in err or "must be" in err
    assert rejected != reached, err
    if name in DURATION_RANGES:
        low, high = DURATION_RANGES[name]
        seconds = expected_seconds(value.strip())
        if seconds is not None:
            assert rejected != (low <= seconds <= high), (value, seconds, err)
        elif value.strip().lower().lstrip("+-") in ("nan", "inf", "infinity", "1e309"):
            assert rejected, err
