"""The agent's side of the protocol, checked as its handlers run: every key a handler reads from
its request (and from the typed parts inside it) is one its request type declares, and every
answer it gives has its answer type's keys and types (as the client checks it).

`HandlerContract.install` wraps `agent_main.HANDLERS`, so any test that calls `agent_main.run_local`
checks both; a read is recorded whether or not the key was sent, so an undeclared optional key
shows up in any run that reaches the read.
"""

from __future__ import annotations

import typing
from collections.abc import Callable
from functools import cache
from typing import Any, get_args, get_origin

import pytest
from typing_extensions import NotRequired, Required, is_typeddict

from launcher.agent import base as agent_base
from launcher.agent import main as agent_main
from launcher.agent import protocol as p
from launcher.container.agentclient import ANSWERS, REQUESTS
from launcher.container.answers import present_problem, problem

Reads = set[tuple[str, str]]  # (type name, key)


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


class Recording(dict[str, Any]):
    """A request (or a typed part of one) that notes each key looked up, present or not."""

    def __init__(self, data: dict[str, Any], kind: type, reads: Reads) -> None:
        keys = declared_keys(kind)
        super().__init__(
            {
                name: recorded(value, keys[name][1], reads) if name in keys else value
                for name, value in data.items()
            }
        )
        self.kind = kind.__name__
        self.reads = reads

    def __getitem__(self, key: str) -> Any:
        self.reads.add((self.kind, key))
        return super().__getitem__(key)

    def get(self, key: str, default: Any = None) -> Any:
        self.reads.add((self.kind, key))
        return super().get(key, default)

    def __contains__(self, key: object) -> bool:
        self.reads.add((self.kind, str(key)))
        return super().__contains__(key)


def typed_part(hint: object) -> type | None:
    """The TypedDict a key's type names (alone or with None), if any."""
    for kind in (hint, *get_args(hint)):
        if isinstance(kind, type) and is_typeddict(kind):
            return kind
    return None


def recorded(value: Any, hint: object, reads: Reads) -> Any:
    kind = typed_part(hint)
    return Recording(value, kind, reads) if kind is not None and isinstance(value, dict) else value


def protocol_types() -> dict[str, type]:
    """Every TypedDict of the protocol by name (what a recorded read names)."""
    return {
        name: kind
        for name, kind in vars(p).items()
        if isinstance(kind, type) and is_typeddict(kind)
    }


Handler = Callable[[dict[str, Any], list[str]], Any]


class HandlerContract:
    def __init__(self) -> None:
        self.reads: Reads = set()
        self.answers: dict[str, int] = {}  # op → answers checked
        self.problems: list[str] = []

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        for op, handler in list(agent_main.HANDLERS.items()):
            monkeypatch.setitem(agent_main.HANDLERS, op, self.wrap(op, handler))

    def wrap(self, op: str, handler: Handler) -> Handler:
        def checked(request: dict[str, Any], warnings: list[str]) -> Any:
            try:
                data = handler(Recording(request, REQUESTS[op], self.reads), warnings)
            except agent_base.AgentError as failed:
                # A failure answers part of its data (the deploy steps so far): checked too.
                found = present_problem(failed.extra.get("data") or {}, ANSWERS[op])
                self._note(op, found)
                raise
            answer = {"ok": True, "op": op, "error": None, "warnings": warnings, **(data or {})}
            self._note(op, problem(answer, ANSWERS[op]))
            return data

        return checked

    def _note(self, op: str, found: str | None) -> None:
        if found is not None:
            self.problems.append(f"{op}: {found}")
        self.answers[op] = self.answers.get(op, 0) + 1

    def undeclared(self) -> list[str]:
        """Reads of keys their type does not declare, as `Type.key`."""
        types = protocol_types()
        return sorted(
            f"{kind}.{key}" for kind, key in self.reads if key not in declared_keys(types[kind])
        )

    def assert_kept(self) -> None:
        assert not self.undeclared(), f"handlers read undeclared keys: {self.undeclared()}"
        assert not self.problems, f"answers that are not their type: {self.problems}"
