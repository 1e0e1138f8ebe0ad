"""A command's parameters, declared once as the fields of its request (a frozen dataclass).

Each field that is a parameter carries an `Option` in its metadata: its help, its type (a
bounded duration or count of `launcher.core.params`), its default, and how the CLI spells it.
From that one declaration the CLI's click options (`launcher.cli.declared`), the Python API's
checks (`launcher.commands.args`) and the Fabric tasks' options (`launcher.tasks`) are made, so
the three cannot drift. A field without an `Option` is the request's own (set by code).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import MISSING, dataclass, field
from typing import Any

OPTION = "launcher.option"


@dataclass(frozen=True)
class Option:
    """How one field of a request is given: on the command line, as a keyword, as a task option."""

    help: str
    type: Any = None  # a click ParamType (Duration, Count, click.Path); None: a flag or text
    names: tuple[str, ...] = ()  # the CLI's spellings (default: --field-name)
    metavar: str | None = None
    show_default: bool = False
    repeat: bool = False  # repeatable (`--env A=1 --env B=2`): a tuple of strings
    nargs: int = 1
    keyword: str = ""  # the API keyword and the task option, when not the field's name
    # A choice the CLI spells as one flag per value: (value, flag, help); the default is none.
    spelled: tuple[tuple[str, str, str], ...] = ()
    api: bool = True  # False: how the CLI shows the result (--json): the CLI and tasks only
    argument: bool = False  # a positional argument (a job's NAME)
    none_is_default: bool = False  # the API's None means the field's default
    parse: Callable[[Any], Any] | None = None  # the checked value into the field's (KEY=VALUE)

    @property
    def is_flag(self) -> bool:
        return self.type is None and not self.spelled and not self.repeat and self.nargs == 1


@dataclass(frozen=True)
class Parameter:
    """A field of a request and its Option."""

    name: str  # the field's name
    option: Option
    default: Any

    @property
    def keyword(self) -> str:
        return self.option.keyword or self.name

    @property
    def spellings(self) -> tuple[str, ...]:
        """How the CLI spells it: `--dry-run` for dry_run, unless declared otherwise."""
        return self.option.names or (f"--{self.name.replace('_', '-')}",)

    @property
    def task_option(self) -> str:
        """The Fabric task's option: the CLI's long spelling (`--set` is set)."""
        long = next(s for s in self.spellings if s.startswith("--"))
        return long[2:].replace("-", "_")

    @property
    def given(self) -> Any:
        """The value when none is given: the field's default, or no strings for a list."""
        return () if self.option.repeat or self.option.nargs > 1 else self.default


def option(
    help: str, default: Any = None, *, factory: Callable[[], Any] | None = None, **how: Any
) -> Any:
    """A field that is a parameter: `wait: float | None = option("Warmup...", type=WAIT)`."""
    metadata = {OPTION: Option(help, **how)}
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


def seconds(help: str, bound: Any, default: float | None = None, **how: Any) -> Any:
    """Seconds within `bound` (a Duration of core/params.py): 90, 90s, 3m on a command line."""
    return option(help, default, type=bound, metavar="DURATION", **how)


def flag(help: str, **how: Any) -> Any:
    """A flag, False unless given."""
    return option(help, False, **how)


def parameters(request_type: type) -> tuple[Parameter, ...]:
    """The parameters of a request type, in the order its fields are declared."""
    found = []
    for f in dataclasses.fields(request_type):
        how = f.metadata.get(OPTION)
        if how is None:
            continue
        default = f.default if f.default is not MISSING else None
        if f.default_factory is not MISSING:
            default = f.default_factory()
        found.append(Parameter(f.name, how, default))
    return tuple(found)
