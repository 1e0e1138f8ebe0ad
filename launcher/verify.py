"""The startup probe: fail fast during the warmup, then judge every poll until K pass in a row.

Modelled on a Kubernetes startup probe. The clock and sleep are injectable so the loop can be
tested on recorded panes without waiting; a poll is one callable returning a PaneState.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from launcher.checks import (
    RESUME_CONTEXT,
    CheckResult,
    ChecksSpec,
    PaneState,
    Poll,
    Verdict,
    evaluate,
    fatal_signs,
    worst,
)
from launcher.errors import ContainerError, ExitCode, RemoteError
from launcher.status import Sample, parse_pane

# Unreachable polls in a row before the probe gives up with exit 3 (a blip is retried).
UNREACHABLE_LIMIT = 3
# Earlier polls keep only the newest samples that history() needs to resume (bounded memory).
KEEP_SAMPLES_PER_OLD_POLL = RESUME_CONTEXT


@dataclass(frozen=True)
class ProbeSettings:
    wait: float
    interval: float
    window: float
    successes: int


@dataclass(frozen=True)
class PollEvent:
    """What the reporter is told after each poll."""

    phase: str  # warmup | judging
    poll: Poll | None
    results: list[CheckResult]
    elapsed: float
    remaining_warmup: float
    consecutive: int
    error: str | None = None


@dataclass
class ProbeResult:
    verdict: str  # healthy | unhealthy | unreachable
    exit_code: ExitCode
    reason: str
    checks: list[CheckResult] = field(default_factory=list)
    polls: list[Poll] = field(default_factory=list)
    duration: float = 0.0
    settings: ProbeSettings | None = None

    @property
    def latest(self) -> Poll | None:
        return self.polls[-1] if self.polls else None

    @property
    def samples(self) -> list[Sample]:
        return list(self.polls[-1].samples) if self.polls else []

    def last_lines(self, count: int = 15) -> list[str]:
        if not self.polls:
            return []
        lines = [line for line in self.polls[-1].state.capture.splitlines() if line.strip()]
        return lines[-count:]

    def timings(self) -> dict[str, Any]:
        settings = dataclasses.asdict(self.settings) if self.settings else {}
        return {"duration": round(self.duration, 3), "polls": len(self.polls), **settings}


PollFn = Callable[[], PaneState]
EventSink = Callable[[PollEvent], None]


class Prober:
    def __init__(
        self,
        poll: PollFn,
        spec: ChecksSpec,
        settings: ProbeSettings,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        on_event: EventSink = lambda event: None,
    ) -> None:
        self.poll_fn = poll
        self.spec = spec
        self.settings = settings
        self.clock = clock
        self.sleep = sleep
        self.on_event = on_event
        self.polls: list[Poll] = []

    def run(self) -> ProbeResult:
        s = self.settings
        start = self.clock()
        warm_end = start + s.wait
        end = warm_end + s.window
        consecutive = 0
        unreachable = 0
        results: list[CheckResult] = []
        while True:
            now = self.clock()
            try:
                state = self.poll_fn()
            except ContainerError as error:
                return self._finish(
                    "unreachable", ExitCode.UNREACHABLE, error.message, results, start
                )
            except RemoteError as error:
                unreachable += 1
                self.on_event(
                    PollEvent(
                        "unreachable",
                        None,
                        results,
                        now - start,
                        max(0.0, warm_end - now),
                        consecutive,
                        error=error.message,
                    )
                )
                if unreachable >= UNREACHABLE_LIMIT or now >= end:
                    return self._finish(
                        "unreachable",
                        ExitCode.UNREACHABLE,
                        f"target unreachable ({unreachable} polls in a row): {error.message}",
                        results,
                        start,
                    )
                self._wait_until(now + s.interval, end)
                continue
            unreachable = 0
            self._remember(Poll(at=now, state=state, samples=tuple(parse_pane(state.capture))))

            fatal = fatal_signs(state, self.spec)
            if worst(fatal) is Verdict.FAIL:
                checks = _merge(fatal, evaluate(self.polls, self.spec))
                reason = "; ".join(
                    f"{r.name}: {_first_line(r.observed)}"
                    for r in fatal
                    if r.verdict is Verdict.FAIL
                )
                return self._finish("unhealthy", ExitCode.UNHEALTHY, reason, checks, start)

            judging = now >= warm_end
            if judging:
                results = evaluate(self.polls, self.spec)
                consecutive = consecutive + 1 if worst(results) is not Verdict.FAIL else 0
            else:
                results = fatal
            self.on_event(
                PollEvent(
                    "judging" if judging else "warmup",
                    self.polls[-1],
                    results,
                    now - start,
                    max(0.0, warm_end - now),
                    consecutive,
                )
            )
            if judging and consecutive >= s.successes:
                return self._finish(
                    "healthy",
                    ExitCode.OK,
                    f"{consecutive} consecutive passing polls",
                    results,
                    start,
                )
            if judging and now >= end:
                failing = [r for r in results if r.verdict is Verdict.FAIL]
                reason = (
                    "; ".join(f"{r.name}: {_first_line(r.observed)}" for r in failing)
                    if failing
                    else f"only {consecutive} of {s.successes} passing polls in the window"
                )
                return self._finish("unhealthy", ExitCode.UNHEALTHY, reason, results, start)
            # Sleep one interval, but never past the end of the warmup or of the window.
            wake = now + s.interval
            if not judging:
                wake = min(wake, warm_end)
            self._wait_until(wake, end)

    def _wait_until(self, wake: float, end: float) -> None:
        now = self.clock()
        # Before the window closes, the last poll happens right at its end rather than after it.
        target = min(wake, end) if now < end else wake
        if target > now:
            self.sleep(target - now)

    def _remember(self, poll: Poll) -> None:
        if self.polls:
            previous = self.polls[-1]
            self.polls[-1] = Poll(
                at=previous.at,
                state=dataclasses.replace(previous.state, capture=""),
                samples=previous.samples[-KEEP_SAMPLES_PER_OLD_POLL:],
            )
        self.polls.append(poll)

    def _finish(
        self, verdict: str, code: ExitCode, reason: str, checks: list[CheckResult], start: float
    ) -> ProbeResult:
        return ProbeResult(
            verdict=verdict,
            exit_code=code,
            reason=reason,
            checks=checks,
            polls=self.polls,
            duration=self.clock() - start,
            settings=self.settings,
        )


def _merge(first: list[CheckResult], second: list[CheckResult]) -> list[CheckResult]:
    """All checks once, the fatal results winning over the full evaluation's of the same name."""
    names = {r.name for r in first}
    return first + [r for r in second if r.name not in names]


def _first_line(text: str) -> str:
    return text.splitlines()[0] if text else ""
