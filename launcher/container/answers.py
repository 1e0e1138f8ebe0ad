"""Checking a value against a protocol type (a TypedDict of `launcher.agent.protocol`): keys and
basic types, derived from the type itself so there is no second description to drift.

The agent that answers is pinned to this launcher's version by the bundle's sha256, so a
mismatch means the container ran something else as `python3` (or a bug): the client stops
there with one clear error instead of a KeyError deep in a workflow. Only what the types say
is checked: required keys present; present keys of the declared basic type (str, int, float,
bool, None, Literal values, lists and dicts element by element, nested TypedDicts); keys the
type does not declare are allowed (an answer may carry more).
"""

from __future__ import annotations

import sys
import types
import typing
from collections.abc import Callable
from functools import cache
from typing import Any, Literal, Union, get_args, get_origin

if sys.version_info >= (3, 11):
    from typing import NotRequired, Required, is_typeddict  # novermin
else:  # protocol.py's types come from typing_extensions on Python 3.10
    from typing_extensions import NotRequired, Required, is_typeddict

# A checker answers None for a good value, else what is wrong with it (and where).
Checker = Callable[[object, str], str | None]


def problem(value: object, kind: object, where: str = "answer") -> str | None:
    """What is wrong with `value` as a `kind` (a protocol type), or None."""
    return checker(kind)(value, where)


@cache
def checker(kind: object) -> Checker:
    """The checker for `kind`, built once per type (the hints are read only here)."""
    if kind is Any or kind is object:
        return _anything
    if kind is None or kind is type(None):
        return _exactly(None, "null")
    if isinstance(kind, type) and is_typeddict(kind):
        return _typed_dict(kind)
    origin = get_origin(kind)
    args = get_args(kind)
    if origin is Literal:
        return _literal(args)
    if origin in (Union, types.UnionType):
        return _union(tuple(checker(arg) for arg in args), kind)
    if origin is list:
        return _list(checker(args[0]) if args else _anything)
    if origin is dict:
        return _dict(checker(args[1]) if args else _anything)
    if kind is bool:
        return _instance((bool,), "a boolean")
    if kind is int:
        return _number((int,), "an integer")
    if kind is float:
        return _number((int, float), "a number")
    if kind is str:
        return _instance((str,), "a string")
    if kind is list:
        return _list(_anything)
    if kind is dict:
        return _dict(_anything)
    raise TypeError(f"no checker for the protocol type {kind!r}")


def _describe(value: object) -> str:
    """The value's type and the start of its repr (escaped: it came from the container)."""
    text = repr(value[:41] if isinstance(value, str | bytes | list) else value)
    return f"{type(value).__name__} {text[:40]}{'…' if len(text) > 40 else ''}"


def _anything(value: object, where: str) -> str | None:
    return None


def _exactly(expected: object, name: str) -> Checker:
    def check(value: object, where: str) -> str | None:
        return None if value is expected else f"{where} is {_describe(value)}, not {name}"

    return check


def _instance(classes: tuple[type, ...], name: str) -> Checker:
    def check(value: object, where: str) -> str | None:
        return None if isinstance(value, classes) else f"{where} is {_describe(value)}, not {name}"

    return check


def _number(classes: tuple[type, ...], name: str) -> Checker:
    """int or float; a bool is not a number here (JSON keeps them apart)."""

    def check(value: object, where: str) -> str | None:
        if isinstance(value, classes) and not isinstance(value, bool):
            return None
        return f"{where} is {_describe(value)}, not {name}"

    return check


def _literal(allowed: tuple[object, ...]) -> Checker:
    def check(value: object, where: str) -> str | None:
        # A bool equals 0 or 1 and hashes alike: compare types too.
        if any(type(value) is type(a) and value == a for a in allowed):
            return None
        return f"{where} is {_describe(value)}, not one of {', '.join(map(repr, allowed))}"

    return check


def _union(choices: tuple[Checker, ...], kind: object) -> Checker:
    def check(value: object, where: str) -> str | None:
        problems = [choice(value, where) for choice in choices]
        if None in problems:
            return None
        # A nested dict that is nearly right says more than "not any of": its own problem.
        nested = [p for p in problems if p is not None and not p.startswith(f"{where} is ")]
        return nested[0] if nested else f"{where} is {_describe(value)}, not {_name(kind)}"

    return check


def _name(kind: object) -> str:
    return " or ".join(
        "null" if arg is type(None) else getattr(arg, "__name__", str(arg))
        for arg in get_args(kind)
    )


def _list(item: Checker) -> Checker:
    def check(value: object, where: str) -> str | None:
        if not isinstance(value, list):
            return f"{where} is {_describe(value)}, not a list"
        for index, element in enumerate(value):
            found = item(element, f"{where}[{index}]")
            if found is not None:
                return found
        return None

    return check


def _dict(item: Checker) -> Checker:
    def check(value: object, where: str) -> str | None:
        if not isinstance(value, dict):
            return f"{where} is {_describe(value)}, not an object"
        for key, element in value.items():
            found = item(element, f"{where}[{key!r}]")
            if found is not None:
                return found
        return None

    return check


def present_problem(value: dict[str, Any], kind: type, where: str = "answer") -> str | None:
    """As `problem`, for only the keys `value` has: a failed op's answer carries part of its
    data (the deploy steps done so far), which is read too."""
    for name, (_, hint) in declared_keys(kind).items():
        if name in value:
            found = checker(hint)(value[name], f"{where}[{name!r}]")
            if found is not None:
                return found
    return None


@cache
def declared_keys(kind: type) -> dict[str, tuple[bool, object]]:
    """A TypedDict's keys: name → (required, type). Read from the annotations themselves:
    with postponed annotations the class's own __required_keys__ cannot see NotRequired."""
    hints = typing.get_type_hints(kind, include_extras=True)
    # Each class's totality is already applied (inherited keys keep their base's); what a
    # string annotation's Required/NotRequired says is applied here.
    required_keys: frozenset[str] = getattr(kind, "__required_keys__", frozenset())
    keys: dict[str, tuple[bool, object]] = {}
    for name, hint in hints.items():
        required = name in required_keys
        if get_origin(hint) is Required:
            required, hint = True, get_args(hint)[0]
        elif get_origin(hint) is NotRequired:
            required, hint = False, get_args(hint)[0]
        keys[name] = (required, hint)
    return keys


def _typed_dict(kind: type) -> Checker:
    fields = [
        (name, required, checker(hint)) for name, (required, hint) in declared_keys(kind).items()
    ]

    def check(value: object, where: str) -> str | None:
        if not isinstance(value, dict):
            return f"{where} is {_describe(value)}, not an object"
        for name, required, field in fields:
            if name not in value:
                if required:
                    return f"{where} has no {name!r}"
                continue
            found = field(value[name], f"{where}[{name!r}]")
            if found is not None:
                return found
        return None

    return check
