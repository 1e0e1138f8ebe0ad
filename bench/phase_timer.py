"""The profiling scripts' timers (bench/profile_deploy.py, bench/profile_status.py): wrappers
put around launcher's functions in memory only, each adding (label, seconds) to a list of
phases as the call returns or raises."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

# A phase timed inside the phase listed after it: shown, but not added to the sum.
NESTED = "(in the next) "

Phases = list[tuple[str, float]]


def timed(phases: Phases, owner: Any, attr: str, label: str | Callable[..., str]) -> None:
    """Time every call of `owner.attr` into `phases`, under `label` (or what it returns for the
    call's arguments)."""
    original = getattr(owner, attr)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            name = label if isinstance(label, str) else label(*args, **kwargs)
            phases.append((name, time.perf_counter() - start))

    setattr(owner, attr, wrapper)
