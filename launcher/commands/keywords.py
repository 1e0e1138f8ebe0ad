"""Keyword sets that several `Launcher` methods share, declared once: the methods take them as
`**keywords: Unpack[...]`, so a type checker still knows every name and type."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, TypedDict


class ProbeKeywords(TypedDict, total=False):
    """The startup probe's settings (`verify`, `smoke`); unset: the playbook's `verify:`."""

    wait: float | None
    interval: float | None
    window: float | None
    successes: int | None
    failure_threshold: int | None


class WatchKeywords(TypedDict, total=False):
    """A watch's settings, the same for targets (`Launcher.watch`) and jobs (`jobs.watch`)."""

    duration: float | None
    interval: float | None
    restart_on_failure: bool
    max_restarts: int
    restart_window: float
    restart_backoff: float
    webhooks: Sequence[str]
    commands: Sequence[str]
    metrics_port: int | None
    metrics_address: str
    state: str | os.PathLike[str] | None


def known_keywords(method: str, given: dict[str, Any], kind: type) -> dict[str, Any]:
    """`given` when every key is one of `kind`'s (a TypedDict), as Python checks a signature."""
    unknown = sorted(set(given) - set(kind.__annotations__))
    if unknown:
        raise TypeError(f"{method}() got an unexpected keyword argument {unknown[0]!r}")
    return given
