"""Checks of the run's progress: status lines at all, and a step that advances."""

from __future__ import annotations

from statistics import median
from typing import TYPE_CHECKING

from launcher.verify.detect import detect_status, suggests, unread_note
from launcher.verify.results import CheckResult, Failure, Verdict
from launcher.verify.rules.base import check
from launcher.verify.rules.text import fmt

if TYPE_CHECKING:
    from launcher.verify.history import RunHistory

__all__ = ["samples", "step"]


@check("samples", reason=4)
def samples(run: RunHistory) -> CheckResult:
    """The latest capture holds at least one status line."""
    latest = run.poll
    count = len(latest.samples)
    expected = "at least 1 status line in the latest capture"
    if count:
        return CheckResult("samples", Verdict.PASS, f"{count} status lines", expected)
    captured = [line for line in latest.state.capture.splitlines() if line.strip()]
    found = detect_status(captured)
    observed = unread_note(len(captured), found)
    # Lines that read as status lines of another shape, from a run none of whose lines was
    # ever read, will not start to read as these: unhealthy at the first judged poll, with
    # the block that reads them. Anything else may be the trainer starting up, or a phase of
    # a run that printed status lines before (an evaluation's): only time makes it a verdict.
    other_shape = suggests(found) and not run.formats
    failure = Failure.IMMEDIATE if other_shape else Failure.PENDING
    return CheckResult("samples", Verdict.FAIL, observed, expected, failure)


@check("step", reason=5)
def step(run: RunHistory) -> CheckResult:
    """The step (or the counter that stands for it) advances within the run's own cadence."""
    spec = run.spec.step
    key = run.progress_key
    expected = f"{key} advancing (changes within {fmt(spec.stall_after)} s)"
    if spec.hang_after is not None:
        expected += f"; not silent for {fmt(spec.hang_after)} s"
    window = run.progress_window()
    if window is not None:
        expected += f"; a passing poll: changed within {fmt(round(window, 1))} s"
    if run.step is None:
        return CheckResult("step", Verdict.FAIL, "no step reported", expected, Failure.PENDING)
    shown = f"{key} {fmt(run.step)}"
    unchanged = run.now - run.step_first_at
    # The `[Nm]` stamps also bound it: [3m] after [0m] means at least 2 minutes apart.
    start, end = run.step_first_min, run.step_last_min
    if start is not None and end is not None:
        unchanged = max(unchanged, (end - start - 1) * 60)
    if unchanged >= spec.stall_after:
        observed = f"{shown} unchanged for {unchanged:.0f} s"
        return CheckResult("step", Verdict.FAIL, observed, expected, Failure.IMMEDIATE)
    quiet = run.latest.state.quiet_for if run.latest is not None else None
    if spec.hang_after is not None and quiet is not None:
        hung = min(unchanged, quiet)
        if hung >= spec.hang_after:
            observed = (
                f"{shown} unchanged, nothing printed and no checkpoint written "
                f"for {fmt(round(float(hung), 1))} s (hang_after {fmt(spec.hang_after)} s)"
            )
            return CheckResult("step", Verdict.FAIL, observed, expected, Failure.IMMEDIATE)
    if window is not None and unchanged > window:
        # Not progressing now, not stalled yet: stall_after / hang_after decide.
        usual = median(run.gaps) if run.gaps else None
        pace = f"its usual gap {fmt(round(usual, 1))} s" if usual else "no cadence yet"
        observed = f"{shown} unchanged for {unchanged:.0f} s ({pace})"
        return CheckResult("step", Verdict.FAIL, observed, expected, Failure.PENDING)
    return CheckResult(
        "step", Verdict.PASS, f"{shown}, last changed {unchanged:.0f} s ago", expected
    )
