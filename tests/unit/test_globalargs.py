"""The global options read from argv before click (launcher/entry/globalargs.py): the same names
as the click group's, read as click reads them."""

from __future__ import annotations

import click
import pytest

from launcher.cli.main import cli
from launcher.entry import console, globalargs


def test_the_names_are_the_click_groups() -> None:
    with_value, flags = set(), set()
    for param in cli.params:
        if not isinstance(param, click.Option) or param.name in ("help", "version"):
            continue
        (flags if param.is_flag else with_value).update(param.opts)
    assert with_value == globalargs.WITH_VALUE
    assert flags == globalargs.FLAGS


@pytest.mark.parametrize(
    "before",
    [
        ["--known-hosts", "kh"],
        ["--known-hosts=kh"],
        ["--identity", "key"],
        ["--identity=key"],
        ["-i", "inv.yaml"],
        ["-iinv.yaml"],
        ["--inventory=inv.yaml"],
        ["-t", "a,b", "-q", "--debug"],
    ],
)
def test_every_global_option_is_read_with_its_value(before: list[str]) -> None:
    """Each global option before the command: the command is found (not the option's value),
    the console answers `--version` at once, and the inventory is the one given."""
    found = globalargs.read([*before, "status", "-t", "x"])
    assert found.command == "status"
    assert console._asks_version_only([*before, "--version"])
    inventory = "inv.yaml" if any("inv" in word for word in before) else None
    assert found.last("--inventory") == inventory


def test_a_value_is_the_next_word_as_click_takes_it() -> None:
    found = globalargs.read(["-i", "--version", "status", "-i", "b.yaml", "--", "deploy"])
    assert found.values["--inventory"] == ["--version", "b.yaml"]
    assert found.command == "status" and found.last("--inventory") == "b.yaml"
    assert globalargs.read(["--", "deploy"]).command == "deploy"
    assert not console._asks_version_only(["-t", "--version"])
