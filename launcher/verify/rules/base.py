"""What a check is: one function of the run's history and what the policy needs to know of it.

    @check("loss", reason=6)
    def loss(run: RunHistory) -> CheckResult: ...

declares the check `loss` next to its function; listing it in `launcher.verify.registry.CHECKS`
makes the judge run it (and the policy count it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from launcher.verify.results import CheckResult

if TYPE_CHECKING:
    from launcher.verify.history import RunHistory

__all__ = ["UNRANKED", "Check", "CheckFn", "check"]

UNRANKED = 1000  # after every ranked check in a reason, in the order the results came

# A check's function: the run's history in, its result(s) out (None: nothing to judge).
CheckFn = Callable[["RunHistory"], "CheckResult | Sequence[CheckResult] | None"]


@dataclass(frozen=True)
class Check:
    name: str  # its result's name (a queue's is `queues.<queue>`)
    judge: CheckFn | None  # None: judged outside the run's history (the probe's `run`)
    warmup: bool = False  # counts during the warmup: a crash needs no warm run
    event: bool = False  # an event, not a level: "for N polls" says nothing about it
    reason: int = UNRANKED  # its place in a reason line: the most telling first
    # Its failure is a restart inside the run: once a watch reported it, the run is judged
    # afresh (so that the restarted process can prove itself and recover).
    restart: bool = False

    def __call__(self, run: RunHistory) -> list[CheckResult]:
        if self.judge is None:
            return []
        found = self.judge(run)
        if found is None:
            return []
        return [found] if isinstance(found, CheckResult) else list(found)


def check(
    name: str,
    *,
    warmup: bool = False,
    event: bool = False,
    reason: int = UNRANKED,
    restart: bool = False,
) -> Callable[[CheckFn], Check]:
    """Declare a check: its name and how it counts, next to its function."""

    def declare(judge: CheckFn) -> Check:
        return Check(name, judge, warmup, event, reason, restart)

    return declare
