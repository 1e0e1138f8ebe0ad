"""The Python API's arguments, checked as the CLI checks its options: the same ranges (the
CLI's own parameter types, launcher.commands.params), and a UsageError (exit code 2) naming the
argument instead of a TypeError from deep inside a workflow or a value the CLI would refuse
(`wait=-5`, `interval=0`, `wait=float('nan')`, which would never end)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, TypeVar

import click

from launcher.commands import params
from launcher.core.errors import UsageError

T = TypeVar("T")


def _converted(name: str, value: Any, kind: Any) -> Any:
    try:
        return kind.convert(value, None, None)
    except click.BadParameter as exc:
        raise UsageError(f"{name}={value!r}: {exc.message}") from None
    except (TypeError, ValueError) as exc:
        raise UsageError(f"{name}={value!r}: {exc}") from None


def converted(name: str, value: Any, kind: Any) -> Any:
    """Text converted by the CLI's own parameter type (a task's `--successes 3`)."""
    return _converted(name, value, kind)


def duration(name: str, value: Any, kind: params.Duration) -> float | None:
    """None (the playbook's setting) or seconds within the CLI's range for this option."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise UsageError(f"{name}={value!r}: must be a number of seconds")
    return float(_converted(name, value, kind))


def seconds(name: str, value: Any, kind: params.Duration) -> float:
    """Seconds within the CLI's range, for an option with no playbook setting (None refused)."""
    found = duration(name, value, kind)
    if found is None:
        raise UsageError(f"{name}=None: must be a number of seconds")
    return found


def strings(name: str, value: Any, what: str = "string") -> tuple[str, ...]:
    """A list or tuple of strings (None: none). One string is refused, not read as a list of
    its characters."""
    if value is None:
        return ()
    if isinstance(value, str) or not isinstance(value, list | tuple):
        raise UsageError(f"{name}={value!r}: must be a list of {what}s")
    for item in value:
        if not isinstance(item, str):
            raise UsageError(f"{name}: {item!r} is not a {what}")
    return tuple(value)


def count(name: str, value: Any, kind: params.Count) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise UsageError(f"{name}={value!r}: must be a whole number")
    return int(_converted(name, value, kind))


def flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise UsageError(f"{name}={value!r}: must be True or False")
    return value


def choice(name: str, value: Any, choices: tuple[str, ...]) -> Any:
    if not isinstance(value, str) or value not in choices:
        raise UsageError(f"{name}={value!r}: must be one of {', '.join(choices)}")
    return value


def target_name(value: Any) -> str | None:
    if value is not None and not isinstance(value, str):
        raise UsageError(f"target={value!r}: must be a target name (a string) or None")
    return value


def path(name: str, value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str | os.PathLike):
        raise UsageError(f"{name}={value!r}: must be a path (str or os.PathLike) or None")
    return os.fspath(value)


def callback(name: str, value: T | None) -> T | None:
    if value is not None and not callable(value):
        raise UsageError(f"{name}={value!r}: must be callable or None")
    return value


Sink = Callable[[str], None]
