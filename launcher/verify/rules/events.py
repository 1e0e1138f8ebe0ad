"""Checks of what happens to the run: its pane dies, it prints a fatal sign, it restarts, it is
replaced by another run."""

from __future__ import annotations

from typing import TYPE_CHECKING

from launcher.verify.lines import clean_text
from launcher.verify.results import CheckResult, Failure, Verdict
from launcher.verify.rules.base import Check, check

if TYPE_CHECKING:
    from launcher.verify.history import FatalSign, RunHistory

__all__ = ["RUN", "alive", "fatal", "replaced", "restarts"]


@check("alive", warmup=True, event=True, reason=1)
def alive(run: RunHistory) -> CheckResult:
    """The session is there and its pane alive (or the run finished)."""
    state = run.poll.state
    expected = "session running, pane alive"
    if not state.session_exists:
        return CheckResult(
            "alive", Verdict.FAIL, "tmux session not found", expected, Failure.IMMEDIATE
        )
    if not state.pane_dead:
        return CheckResult("alive", Verdict.PASS, "session running", expected)
    status = state.dead_status if state.dead_status is not None else state.exit_code
    if status == 0 and not state.stopped:
        # Exit 0 is terminal success (the run finished), not a crash: see verify.lifecycle.
        return CheckResult("alive", Verdict.PASS, "run finished (exit status 0)", expected)
    tail = [line for line in clean_text(state.capture).splitlines() if line.strip()][-5:]
    observed = "pane dead" + (f", exit status {status}" if status is not None else "")
    if tail:
        observed += "\n" + "\n".join(tail)  # the first line stays a one-line summary
    return CheckResult("alive", Verdict.FAIL, observed, expected, Failure.IMMEDIATE)


@check("fatal", warmup=True, event=True, reason=3)
def fatal(run: RunHistory) -> CheckResult:
    """No fail pattern the run did not go on after (see `launcher.verify.history`)."""
    patterns = run.spec.fail_patterns
    expected = (
        "none of: " + ", ".join(patterns) if patterns else "no fail patterns configured"
    ) + "; or the run goes on after it"
    forgiven = run.forgiven()
    failing = [
        s
        for s in run.fatal
        if not s.noise and (s.outcome == "open" or (s.outcome == "ended" and not forgiven))
    ]
    if failing:
        sign = failing[-1]
        observed = sign.describe()
        if sign.outcome == "ended":
            observed += " (then the run restarted)"
            return CheckResult("fatal", Verdict.FAIL, observed, expected, Failure.DEFINITE)
        return CheckResult("fatal", Verdict.FAIL, observed, expected, _open_kind(run, sign))
    if run.fatal:
        sign = run.fatal[-1]
        if sign.outcome == "ended":
            observed = f"{sign.describe()} (then the run restarted, before the probe)"
            return CheckResult("fatal", Verdict.WARN, observed, expected)
        if sign.noise:
            observed = f"finaliser noise, harmless: {sign.describe()}"
        else:
            before = "?" if sign.step_before is None else sign.step_before
            observed = f"{sign.describe()} (the run went on: step {before} → {sign.step_after})"
        return CheckResult("fatal", Verdict.WARN, observed, expected)
    return CheckResult("fatal", Verdict.PASS, "no fail pattern", expected)


def _open_kind(run: RunHistory, sign: FatalSign) -> Failure:
    """A fatal sign nothing has followed yet: definite once the run had time to go on."""
    if run.latest is not None and (
        run.latest.state.pane_dead or not run.latest.state.session_exists
    ):
        return Failure.DEFINITE
    if sign.step_before is None and not run.warmup_over:
        return Failure.PENDING  # printed while starting up: the warmup is its grace
    cadence = run.cadence()
    if cadence is not None and run.now - sign.at < 2 * cadence:
        return Failure.PENDING  # the trainer prints slowly: give it two of its own lines
    return Failure.DEFINITE


@check("restarts", warmup=True, event=True, reason=2, restart=True)
def restarts(run: RunHistory) -> CheckResult:
    """No restart during the probe (one before it is forgiven)."""
    expected = "no restart during the probe (one before it is forgiven)"
    if not run.restarts:
        return CheckResult("restarts", Verdict.PASS, "none", expected)
    start = run.start or 0.0
    count = len(run.restarts)
    times = "once" if count == 1 else f"{count} times"
    shown = ", ".join(r.describe(start) for r in run.restarts[:3])
    observed = f"restarted {times} ({shown}{', …' if count > 3 else ''})"
    if run.forgiven():
        return CheckResult("restarts", Verdict.WARN, observed, expected)
    return CheckResult("restarts", Verdict.FAIL, observed, expected, Failure.DEFINITE)


# Judged by the probe, not from the run's history: the run it pinned was replaced by another.
RUN = Check("run", None, event=True, reason=0)


def replaced(expected: str | None, new: str) -> CheckResult:
    """The `run` check's failure: the probe's run was replaced by `new`."""
    return CheckResult(
        "run",
        Verdict.FAIL,
        f"run replaced by {new}",
        f"run {expected or '(unmarked)'} throughout",
        Failure.IMMEDIATE,
    )
