"""The `gpus` check: the run holds its GPUs and they are busy while it prints."""

from __future__ import annotations

from typing import TYPE_CHECKING

from launcher.verify.gpus import judge as judge_gpus
from launcher.verify.results import CheckResult, Failure, Verdict
from launcher.verify.rules.base import check

if TYPE_CHECKING:
    from launcher.verify.history import RunHistory

__all__ = ["gpus"]


@check("gpus")
def gpus(run: RunHistory) -> CheckResult | None:
    """The run holds its GPUs and they are busy while it prints (launcher.verify.gpus)."""
    sample = run.latest.state.gpus if run.latest is not None else None
    if sample is None or sample.want <= 0:
        return None
    found = judge_gpus(sample, run.spec.gpus, printing=bool(run.new_samples))
    if found.ok:
        return CheckResult("gpus", Verdict.PASS, found.observed, found.expected)
    if found.warn:
        return CheckResult("gpus", Verdict.WARN, found.observed, found.expected)
    failure = Failure.DEFINITE if found.ok is False else Failure.PENDING
    return CheckResult("gpus", Verdict.FAIL, found.observed, found.expected, failure)
