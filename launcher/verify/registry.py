"""The checks a run is judged by, in the order their results are shown.

Each check is one function with how it counts declared next to it (`rules.base.check`): whether
it counts during the warmup, whether it is an event or a level, its place in a reason line. A new
check is one function (in a module of `launcher.verify.rules`) and one line here.
"""

from __future__ import annotations

from launcher.verify.rules import devices, events, numbers, progress
from launcher.verify.rules.base import Check

__all__ = ["CHECKS", "Check", "event_check", "find", "reason_rank", "warmup_check"]

CHECKS: tuple[Check, ...] = (
    events.RUN,
    events.alive,
    events.fatal,
    events.restarts,
    progress.samples,
    numbers.queues,
    numbers.throughput,
    progress.step,
    numbers.loss,
    numbers.finite,
    devices.gpus,
)
_BY_NAME = {c.name: c for c in CHECKS}
_NONE = Check("", None)


def find(name: str) -> Check:
    """The check a result of this name came from (a queue's result is `queues.<queue>`)."""
    return _BY_NAME.get(name.split(".")[0], _NONE)


def warmup_check(name: str) -> bool:
    return find(name).warmup


def event_check(name: str) -> bool:
    return find(name).event


def reason_rank(name: str) -> int:
    return find(name).reason
