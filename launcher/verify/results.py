"""A check's result and how it counts: the leaf the checks, the policy and the reports share."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from launcher.core.enums import StrEnum

__all__ = ["CheckResult", "Failure", "Verdict", "worst_verdict"]


class Verdict(StrEnum):
    PASS = "pass"
    WARN = "warn"
    FAIL = "fail"
    # Not judged: the run's format never reports the quantity and the playbook does not ask
    # for it (an HF Trainer without its progress bar prints no rate). Neither pass nor fail.
    SKIP = "skip"


class Failure(StrEnum):
    """How a failing check counts towards the verdict (see `launcher.verify.policy`)."""

    IMMEDIATE = "immediate"
    DEFINITE = "definite"
    PENDING = "pending"


_RANK = {Verdict.SKIP: 0, Verdict.PASS: 0, Verdict.WARN: 1, Verdict.FAIL: 2}


@dataclass(frozen=True)
class CheckResult:
    name: str
    verdict: Verdict
    observed: str
    expected: str
    failure: Failure | None = None  # for a FAIL; None means definite

    @property
    def kind(self) -> Failure | None:
        """How this result counts: None unless it fails."""
        if self.verdict is not Verdict.FAIL:
            return None
        return self.failure or Failure.DEFINITE


def worst_verdict(results: Iterable[CheckResult]) -> Verdict:
    """The most severe verdict; PASS for no results."""
    return max((r.verdict for r in results), key=_RANK.__getitem__, default=Verdict.PASS)
