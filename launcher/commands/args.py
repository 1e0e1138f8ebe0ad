"""A request built from given values, each checked as declared (`launcher.core.declare`): the
CLI's own parameter types and ranges, and a UsageError (exit code 2) naming the argument
instead of a TypeError from deep inside a workflow or a value the CLI would refuse (`wait=-5`,
`interval=0`, `wait=float('nan')`, which would never end). The API, the CLI and the Fabric
tasks all build their requests here."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, TypeVar

import click

from launcher.core.declare import Parameter, parameters
from launcher.core.errors import UsageError
from launcher.core.params import Duration

T = TypeVar("T")


def build(
    command: str, request_type: type[T], values: Mapping[str, Any], *, api: bool, text: bool = False
) -> T:
    """The request from `values` (by keyword; unknown ones refused). `api`: only the API's
    keywords (not how the CLI shows a result); `text`: values may be the command line's text
    (a task's `--successes 3`), converted with the CLI's own type first."""
    known = {p.keyword: p for p in parameters(request_type) if p.option.api or not api}
    unknown = set(values) - set(known)
    if unknown:
        raise UsageError(f"{command}: unknown argument(s) {', '.join(sorted(unknown))}")
    fields = {
        p.name: checked(p, values.get(keyword, p.given), text=text) for keyword, p in known.items()
    }
    return request_type(**fields)


def checked(param: Parameter, value: Any, *, text: bool = False) -> Any:
    """One value, checked (and converted) as its parameter is declared."""
    found = _checked(param, value, text)
    return param.option.parse(found) if param.option.parse else found


def _checked(param: Parameter, value: Any, text: bool) -> Any:
    how, name = param.option, param.keyword
    if how.spelled:
        return choice(name, value, (param.default, *(v for v, _, _ in how.spelled)))
    if how.repeat or how.nargs > 1:
        return strings(name, value)
    if how.argument:
        if not isinstance(value, str) or not value:
            raise UsageError(f"{name}={value!r}: must be a name (a string)")
        return value
    if how.is_flag and isinstance(param.default, bool):
        return flag(name, value)
    if isinstance(how.type, Duration):
        if value is None and (param.default is None or how.none_is_default):
            return param.default
        return seconds(name, value, how.type)
    if isinstance(how.type, click.IntRange):
        if value is None and param.default is None:
            return None
        if text and isinstance(value, str):
            value = converted(name, value, how.type)
        return count(name, value, how.type)
    if isinstance(how.type, click.Path):
        return path(name, value)
    if value is not None and not isinstance(value, str):
        raise UsageError(f"{name}={value!r}: must be a string or None")
    return value


def spelled_choice(param: Parameter, given: dict[str, Any]) -> Any:
    """A choice the CLI spells as flags (--purge-checkpoints, --keep-checkpoints), read back
    from the flags' values in `given` (removed from it); two of them exclude each other."""
    flags = [(value, spelling) for value, spelling, _ in param.option.spelled]
    chosen = [(value, s) for value, s in flags if given.pop(dest(s), False)]
    if len(chosen) > 1:
        raise UsageError(f"{' and '.join(s for _, s in chosen)} exclude each other")
    return chosen[0][0] if chosen else param.default


def dest(spelling: str) -> str:
    """An option's Python name: `--purge-checkpoints` is purge_checkpoints."""
    return spelling.lstrip("-").replace("-", "_")


def converted(name: str, value: Any, kind: Any) -> Any:
    """A value converted by the CLI's own parameter type."""
    try:
        return kind.convert(value, None, None)
    except click.BadParameter as exc:
        raise UsageError(f"{name}={value!r}: {exc.message}") from None
    except (TypeError, ValueError) as exc:
        raise UsageError(f"{name}={value!r}: {exc}") from None


def seconds(name: str, value: Any, kind: Duration) -> float:
    """Seconds within the CLI's range for this option (None refused)."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise UsageError(f"{name}={value!r}: must be a number of seconds")
    return float(converted(name, value, kind))


def duration(name: str, value: Any, kind: Duration) -> float | None:
    """None (the playbook's setting) or seconds within the CLI's range for this option."""
    return None if value is None else seconds(name, value, kind)


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


def count(name: str, value: Any, kind: click.IntRange) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise UsageError(f"{name}={value!r}: must be a whole number")
    return int(converted(name, value, kind))


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
