"""An agent's answer checked against its protocol type (a TypedDict of `launcher.agent.protocol`)
by a pydantic `TypeAdapter` of that type: the types are the only description, so there is no
second one to drift.

The agent that answers is pinned to this launcher's version by the bundle's sha256, so a
mismatch means the container ran something else as `python3` (or a bug): the client stops
there with one clear error instead of a KeyError deep in a workflow. Only what the types say
is checked, strictly (JSON's types kept apart: "0" is not an integer, true not a number):
required keys present, present keys of their declared type, nested types within; keys a type
does not declare are allowed (an answer may carry more).

An adapter is built the first time its type is checked, once per process: `launcher status`
builds the envelope's and the poll answer's, none of the other ops'.
"""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pydantic import TypeAdapter
    from pydantic_core import ErrorDetails

# What a value should have been, by pydantic's error type (the rest: pydantic's own message).
EXPECTED = {
    "bool_type": "a boolean",
    "int_type": "an integer",
    "float_type": "a number",
    "string_type": "a string",
    "list_type": "a list",
    "dict_type": "an object",
    "none_required": "null",
}


def problem(value: object, kind: type, where: str = "answer") -> str | None:
    """What is wrong with `value` as a `kind` (a protocol type), or None."""
    return _first(_errors(value, kind), where)


def present_problem(value: dict[str, Any], kind: type, where: str = "answer") -> str | None:
    """As `problem`, for only the keys `value` has: a failed op's answer carries part of its
    data (the deploy steps done so far), which is read too."""
    errors = _errors(value, kind)
    return _first([e for e in errors if e["type"] != "missing" or len(e["loc"]) > 1], where)


@cache
def adapter(kind: type) -> TypeAdapter[Any]:
    """`kind`'s adapter, built on its first use (pydantic reads the type's hints then)."""
    from pydantic import TypeAdapter

    from launcher.config.models import interrupted_build

    try:
        return TypeAdapter(kind)
    except Exception as exc:
        if interrupted_build(exc):  # a Ctrl-C while pydantic-core built it: still a Ctrl-C
            raise KeyboardInterrupt from None
        raise


def _errors(value: object, kind: type) -> list[ErrorDetails]:
    from pydantic import ValidationError

    try:
        adapter(kind).validate_python(value, strict=True)
    except ValidationError as error:
        return error.errors(include_url=False)
    return []


def _first(errors: list[ErrorDetails], where: str) -> str | None:
    """The first error in the answer's own words: where it is, what it is, what it should be."""
    if not errors:
        return None
    error = errors[0]
    loc = error["loc"]
    if error["type"] == "missing":
        return f"{_path(where, loc[:-1])} has no {loc[-1]!r}"
    found = f"{_path(where, loc)} is {_describe(error['input'])}"
    if error["type"] == "literal_error":
        return f"{found}, not one of {(error.get('ctx') or {}).get('expected')}"
    expected = EXPECTED.get(error["type"])
    return f"{found}, not {expected}" if expected else f"{found}: {error['msg']}"


def _path(where: str, loc: tuple[int | str, ...]) -> str:
    return where + "".join(f"[{part!r}]" for part in loc)


def _describe(value: object) -> str:
    """The value's type and the start of its repr (escaped: it came from the container)."""
    text = repr(value[:41] if isinstance(value, str | bytes | list) else value)
    return f"{type(value).__name__} {text[:40]}{'…' if len(text) > 40 else ''}"
