"""Health checks: pane state and parsed status lines in, verdicts out. Pure; no I/O.

A `Judge` is a run's history (`launcher.verify.history.RunHistory`: the polls taken in order,
every line once) judged after each poll by every check in `launcher.verify.registry`. How a
failing check counts towards a verdict (`Failure`) is the policy's: `launcher.verify.policy`.
"""

from __future__ import annotations

from collections.abc import Sequence

from launcher.verify.history import RunHistory
from launcher.verify.pane import PaneState, Poll
from launcher.verify.registry import CHECKS
from launcher.verify.results import CheckResult, Verdict
from launcher.verify.spec import ChecksSpec

__all__ = ["Judge", "evaluate", "fatal_signs"]


class Judge(RunHistory):
    """Takes a run's polls in order and judges each against the run's history so far."""

    def add(self, poll: Poll, *, warmup_over: bool = True) -> list[CheckResult]:
        """Take one poll and judge the run as of it."""
        self.take(poll)
        return self.results(warmup_over=warmup_over)

    def results(self, *, warmup_over: bool = True) -> list[CheckResult]:
        """Every registered check on the history so far, in the registry's order."""
        self.warmup_over = warmup_over
        if self.latest is None:
            return [CheckResult("alive", Verdict.FAIL, "no poll taken", "at least one poll")]
        return [result for check in CHECKS for result in check(self)]


def fatal_signs(state: PaneState, spec: ChecksSpec) -> list[CheckResult]:
    """`alive` and `fatal` on one poll: enough to fail fast during warmup."""
    from launcher.verify.parse import parse_pane

    samples = tuple(parse_pane(state.capture, width=state.pane_width))
    by_name = {r.name: r for r in Judge(spec).add(Poll(0.0, state, samples))}
    return [by_name["alive"], by_name["fatal"]]


def evaluate(polls: Sequence[Poll], spec: ChecksSpec) -> list[CheckResult]:
    """All checks on the history so far (latest poll last), the warmup taken as over."""
    judge = Judge(spec)
    results = judge.results()
    for poll in polls:
        results = judge.add(poll)
    return results
