"""A leaf: `StrEnum`, as Python 3.11's `enum.StrEnum` behaves, for the client's Python 3.10."""

from __future__ import annotations

from enum import Enum


class StrEnum(str, Enum):
    """A member is a string equal to its value, and prints as it (`str()`, f-strings, JSON).

    On 3.10 a `(str, Enum)` member prints as `Class.NAME`; 3.11's StrEnum prints its value."""

    def __str__(self) -> str:
        return str.__str__(self)

    def __format__(self, spec: str) -> str:
        return str.__format__(str(self), spec)
