"""The verdict policy: how the checks' results become a verdict, poll after poll.

One policy for verify (the startup probe), smoke (its probe), status (one poll) and watch
(a probe that never ends), so that they cannot disagree.

How a failing check counts (`Failure`, the `failure` of a FAIL result):

- immediate: unhealthy at this poll. The pane is dead or the session gone; the step has not
  changed for `step.stall_after` seconds; a queue bucket stayed empty for `failure_threshold`
  polls; the run was replaced by another. (These carry their own time scale, so waiting longer
  would add nothing.)
- definite: unhealthy after `failure_threshold` failing polls in a row. A fatal sign the run
  did not survive; a restart; loss not finite, risen by more than `loss.max_rise` over the lowest
  seen, or back near `loss.ceiling`; another number (e.g. grad_norm) not finite; throughput below
  `throughput.drop` x this run's peak, or below `throughput.min` and not rising; a queue of the
  wrong length.
- pending: not passing *yet*; only the end of the window makes it a verdict. No status line; no
  step, throughput or queue reported; throughput below the minimum but still rising; loss still
  near the ceiling it started at; a fatal sign printed before any progress, during the warmup.

During the warmup only the checks that count in it (a crash, a fatal sign, a restart: see each
check's `warmup` in `launcher.verify.registry`) count. After it, `successes` polls in a row with
no failing check are healthy.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from launcher.verify.registry import event_check, find, reason_rank, warmup_check
from launcher.verify.results import CheckResult, Failure, Verdict, worst_verdict

__all__ = [
    "Judgement",
    "Outcome",
    "Tally",
    "counted",
    "describe_failures",
    "outcome",
    "probe_reason",
]


def counted(results: Sequence[CheckResult], *, judging: bool) -> list[CheckResult]:
    """The results that count at this poll: all of them once the warmup is over, else only
    those of the checks that count during the warmup."""
    if judging:
        return list(results)
    return [r for r in results if warmup_check(r.name)]


@dataclass(frozen=True)
class Judgement:
    """One poll under the policy."""

    counted: list[CheckResult]  # the results that counted
    immediate: list[CheckResult]  # counted immediate failures
    definite: list[CheckResult]  # counted definite failures
    unhealthy: bool  # an immediate failure, or `failure_threshold` failing polls in a row
    failing: int  # polls in a row with a definite failure
    passing: int  # judged polls in a row with no failing check

    @property
    def failures(self) -> list[CheckResult]:
        """What made the poll unhealthy, for its reason."""
        return self.immediate + self.definite

    @property
    def restarted(self) -> bool:
        """A counted failure is a restart inside the run (see `Check.restart`)."""
        return any(find(r.name).restart for r in self.counted if r.kind)


@dataclass
class Tally:
    """Pass/fail counting across one run's polls (Kubernetes' failureThreshold and
    successThreshold): definite failures in a row, passing polls in a row, each check's streak."""

    failure_threshold: int
    failing: int = 0
    passing: int = 0
    streaks: dict[str, int] = field(default_factory=dict)  # check -> failing polls in a row

    def take(self, results: Sequence[CheckResult], *, judging: bool) -> Judgement:
        """Count one poll's results (every check's; the warmup's filter is applied here)."""
        taken = counted(results, judging=judging)
        immediate = [r for r in taken if r.kind is Failure.IMMEDIATE]
        definite = [r for r in taken if r.kind is Failure.DEFINITE]
        names = {r.name for r in definite}
        self.streaks = {name: self.streaks.get(name, 0) + 1 for name in names}
        self.failing = self.failing + 1 if definite else 0
        unhealthy = bool(immediate) or self.failing >= self.failure_threshold
        if unhealthy:
            self.passing = 0
        elif judging:
            # A pending failure is no failure yet, but no pass either.
            passed = worst_verdict(results) is not Verdict.FAIL
            self.passing = self.passing + 1 if passed else 0
        return Judgement(taken, immediate, definite, unhealthy, self.failing, self.passing)


Outcome = Literal["unhealthy", "healthy", "window over", "pending"]


def outcome(judged: Judgement, *, judging: bool, successes: int, window_over: bool) -> Outcome:
    """Where one poll leaves a run's judgement (verify's probe, watch): unhealthy at once on
    what the tally calls unhealthy; healthy after `successes` judged passing polls in a row;
    `window over` when the window ends first (the caller words why); else pending."""
    if judged.unhealthy:
        return "unhealthy"
    if not judging:
        return "pending"
    if judged.passing >= successes:
        return "healthy"
    return "window over" if window_over else "pending"


def describe_failures(
    failures: Sequence[CheckResult], streaks: Mapping[str, int] | None = None
) -> str:
    """One line: each failing check and its evidence, the most telling first; with `streaks`
    (failing polls in a row by check), a definite failure says for how many polls."""
    parts = []
    for result in sorted(failures, key=lambda r: reason_rank(r.name)):
        text = _first_line(result.observed)
        subject = result.name.split(".")[-1]
        if not text.startswith(subject) and not text.startswith("restarted"):
            text = f"{result.name}: {text}"
        polls = (streaks or {}).get(result.name, 0)
        if result.kind is Failure.DEFINITE and polls > 1 and not event_check(result.name):
            text += f", for {polls} polls"
        parts.append(text)
    return "; ".join(parts)


def probe_reason(failures: Sequence[CheckResult], streaks: Mapping[str, int]) -> str:
    """The probe's reason: as `describe_failures`, but with no status line at all, what else
    was never reported follows from that and is left out."""
    if any(r.name == "samples" for r in failures):
        failures = [r for r in failures if r.kind is not Failure.PENDING or r.name == "samples"]
    return describe_failures(failures, streaks)


def _first_line(text: str) -> str:
    return text.splitlines()[0] if text else ""
