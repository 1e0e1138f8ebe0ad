"""The startup probe: fail fast, judge every poll after the warmup, pass after K in a row.

Modelled on a Kubernetes startup probe. Every poll feeds one `Judge` (the run's own history);
the verdict policy (`launcher.verify.policy`) counts its results: an immediate failure ends the
probe at once, definite ones after `failure_threshold` failing polls in a row, pending ones
only when the window ends; during the warmup only the checks that count in it. The probe pins
the run it started on (the deploy's run marker): if a deploy replaces it meanwhile, the probe
ends with exit 1 "run replaced by ...", and never judges samples of two runs together.

Every poll is bounded by the host's `command_timeout` and by what is left of the probe (but at
least `POLL_FLOOR`), so a hung host costs at most one bounded poll past `wait + window`.
The clock and sleep are injectable so the loop can be tested on recorded panes without waiting.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

from launcher.core.errors import ContainerError, ExitCode, RemoteError
from launcher.verify.checks import Judge
from launcher.verify.lifecycle import State, ended, replacing
from launcher.verify.pane import PaneState, Poll
from launcher.verify.parse import parse_pane
from launcher.verify.policy import Tally, outcome, probe_reason
from launcher.verify.results import CheckResult, Verdict
from launcher.verify.rules.events import replaced
from launcher.verify.samples import Sample
from launcher.verify.spec import ChecksSpec

# Unreachable polls in a row before the probe gives up with exit 3 (a blip is retried).
UNREACHABLE_LIMIT = 3
# Earlier polls keep only their newest samples (bounded memory; the Judge keeps the history).
KEEP_SAMPLES_PER_OLD_POLL = 3
# The shortest deadline a poll gets, even at the very end of the window.
POLL_FLOOR = 10.0


@dataclass(frozen=True)
class ProbeSettings:
    wait: float
    interval: float
    window: float
    successes: int
    failure_threshold: int = 3
    poll_timeout: float | None = None  # the host's command_timeout: one poll's deadline at most
    # The run is meant to be short (a CI smoke run with a small max_steps): exiting 0 after
    # progress, before the passing polls were counted, is healthy (`verify.finish_ok`).
    finish_ok: bool = False


@dataclass(frozen=True)
class PollEvent:
    """What the reporter is told after each poll."""

    phase: str  # warmup | judging | replacing | unreachable
    poll: Poll | None
    results: list[CheckResult]
    elapsed: float
    remaining_warmup: float
    consecutive: int
    error: str | None = None
    failing: int = 0  # failing polls in a row (definite failures)
    # Every check's result at this poll, counted or not (the warmup counts only some).
    checks: list[CheckResult] = field(default_factory=list)


@dataclass
class ProbeResult:
    verdict: str  # healthy | unhealthy | unreachable: the exit code in words
    exit_code: ExitCode
    reason: str
    checks: list[CheckResult] = field(default_factory=list)
    polls: list[Poll] = field(default_factory=list)
    duration: float = 0.0
    settings: ProbeSettings | None = None
    run: str | None = None  # the run marker the probe judged
    state: State | None = None  # where the run is in its life (None: unreachable, not known)
    # The container's latest deploy record as the last poll saw it (sha256, time, operator):
    # the report's header names what was judged.
    record: dict[str, Any] | None = None

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


PollFn = Callable[[float], PaneState]  # takes the poll's deadline in seconds
EventSink = Callable[[PollEvent], None]
ParseFn = Callable[[str, int | None], list[Sample]]  # a capture and its pane's width


def lasted(state: PaneState, probed: float) -> str:
    """How long a finished run ran, as far as the poll tells: from its session's start to its
    last output or checkpoint write (the container's clock), else the probe's own time."""
    if state.age is not None and state.quiet_for is not None:
        return f"after {max(0.0, state.age - state.quiet_for):.0f} s"
    return f"within {probed:.0f} s of the probe's start"


class _Finished(Exception):
    def __init__(self, result: ProbeResult) -> None:
        super().__init__(result.reason)
        self.result = result


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
        parse: ParseFn = lambda text, width: parse_pane(text, width=width),
        expected_run: str | None = None,
        history_lines: int | None = None,
    ) -> None:
        self.poll_fn = poll
        self.spec = spec
        self.settings = settings
        self.clock = clock
        self.sleep = sleep
        self.on_event = on_event
        self.parse = parse
        self.polls: list[Poll] = []
        self.judge = Judge(spec, live=True, history_lines=history_lines, interval=settings.interval)
        # The run being judged: the deploy's (when known) or the first one seen.
        self.run_id = expected_run
        self._pinned = expected_run is not None
        self._start = 0.0
        self._warm_end = 0.0
        self._end = 0.0
        self._results: list[CheckResult] = []  # what counted at the latest poll
        self._all: list[CheckResult] = []  # every check at the latest poll
        self._unreachable = 0
        self.tally = Tally(settings.failure_threshold)

    def run(self) -> ProbeResult:
        s = self.settings
        self._start = self.clock()
        self._warm_end = self._start + s.wait
        self._end = self._warm_end + s.window
        try:
            while True:
                self._step()
        except _Finished as finished:
            return finished.result

    # -- one poll -------------------------------------------------------------------------

    def _step(self) -> None:
        now = self.clock()
        state = self._poll(now)
        if state is None:
            return  # unreachable, retried after an interval
        if self._replaced(state, now):
            return  # a deploy is replacing the run: wait for it
        judging = now >= self._warm_end
        samples = tuple(self.parse(state.capture, state.pane_width))
        poll = Poll(at=now, state=state, samples=samples)
        self._remember(poll)
        results = self._all = self.judge.add(poll, warmup_over=judging)
        if ended(state) is State.FINISHED:
            self._finished(state, now)
        judged = self.tally.take(results, judging=judging)
        self._results = judged.counted
        if judged.unhealthy:
            self._finish("unhealthy", ExitCode.UNHEALTHY, self._reason(judged.failures))
        self._emit("judging" if judging else "warmup", poll, now)
        found = outcome(
            judged,
            judging=judging,
            successes=self.settings.successes,
            window_over=self.clock() >= self._end,
        )
        if found == "healthy":
            self._finish("healthy", ExitCode.OK, f"{judged.passing} consecutive passing polls")
        if found == "window over":
            self._finish("unhealthy", ExitCode.UNHEALTHY, self._window_reason())
        # Sleep one interval, but never past the end of the warmup or of the window.
        wake = now + self.settings.interval
        if not judging:
            wake = min(wake, self._warm_end)
        self._wait_until(wake)

    def _finished(self, state: PaneState, now: float) -> NoReturn:
        """The run exited 0 before the probe counted its passing polls (after them it would have
        ended healthy already). A run that exits 0 before any status line with a step (a
        misspelt flag, `--help`) proved nothing; one that made progress and stopped early (a
        debug `max_steps` left in) was not seen healthy either, unless the playbook says the
        run is meant to be short (`verify.finish_ok`)."""
        step = self.judge.progress
        if step is None:
            reason = "the run exited 0 before any progress was seen"
            self._finish("unhealthy", ExitCode.UNHEALTHY, reason, State.FINISHED)
        if not self.settings.finish_ok:
            reason = (
                f"the run finished (exit 0) {lasted(state, now - self._start)} at {step}, "
                "before it could be judged healthy (verify.finish_ok: true for a run meant to "
                "be short)"
            )
            self._finish("unhealthy", ExitCode.UNHEALTHY, reason, State.FINISHED)
        reason = f"the run finished (exit 0) at {step}"
        self._finish("healthy", ExitCode.OK, reason, State.FINISHED)

    def _poll(self, now: float) -> PaneState | None:
        try:
            state = self.poll_fn(self._deadline(now))
        except ContainerError as error:
            self._finish("unreachable", ExitCode.UNREACHABLE, error.message)
        except RemoteError as error:
            self._unreachable += 1
            self.on_event(
                PollEvent(
                    "unreachable",
                    None,
                    self._results,
                    now - self._start,
                    max(0.0, self._warm_end - now),
                    self.tally.passing,
                    error=error.message,
                )
            )
            if self._unreachable >= UNREACHABLE_LIMIT or self.clock() >= self._end:
                self._finish(
                    "unreachable",
                    ExitCode.UNREACHABLE,
                    f"target unreachable ({self._unreachable} polls in a row): {error.message}",
                )
            self._wait_until(now + self.settings.interval)
            return None
        self._unreachable = 0
        return state

    def _deadline(self, now: float) -> float:
        """This poll's deadline: what is left of the probe (at least POLL_FLOOR), at most the
        host's command_timeout."""
        bound = max(self._end - now, POLL_FLOOR)
        limit = self.settings.poll_timeout
        return bound if limit is None else min(limit, bound)

    def _replaced(self, state: PaneState, now: float) -> bool:
        """Pin the run; end the probe if another replaced it. True while a deploy replaces it."""
        gone = not state.session_exists or state.pane_dead
        if state.session_exists and not gone and not self._pinned:
            self.run_id, self._pinned = state.run, True
        elif state.session_exists and self._pinned and state.run != self.run_id:
            new = state.run or "a session launcher did not start"
            check = replaced(self.run_id, new)
            self._all = [check, *(self._all or self._results)]
            self._finish("unhealthy", ExitCode.UNHEALTHY, f"run replaced by {new}")
        why = replacing(state)
        if why is not None and self.clock() < self._end:
            # The next polls show its successor (reported as a replacement) or, if the deploy
            # failed, nothing.
            self._emit("replacing", None, now, error=why)
            self._wait_until(now + self.settings.interval)
            return True
        return False

    # -- reasons --------------------------------------------------------------------------

    def _reason(self, failures: Sequence[CheckResult]) -> str:
        """One line: each failing check and its evidence, the most telling first."""
        return probe_reason(failures, self.tally.streaks)

    def _window_reason(self) -> str:
        failing = [r for r in self._results if r.verdict is Verdict.FAIL]
        if failing:
            return self._reason(failing)
        passing = self.tally.passing
        return f"only {passing} of {self.settings.successes} passing polls in the window"

    # -- plumbing -------------------------------------------------------------------------

    def _emit(self, phase: str, poll: Poll | None, now: float, error: str | None = None) -> None:
        self.on_event(
            PollEvent(
                phase,
                poll,
                self._results,
                now - self._start,
                max(0.0, self._warm_end - now),
                self.tally.passing,
                error=error,
                failing=self.tally.failing,
                checks=self._all,
            )
        )

    def _wait_until(self, wake: float) -> None:
        now = self.clock()
        # Before the window closes, the last poll happens right at its end rather than after it.
        target = min(wake, self._end) if now < self._end else wake
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
        self, verdict: str, code: ExitCode, reason: str, state: State | None = None
    ) -> NoReturn:
        if state is None and verdict != "unreachable":
            latest = self.polls[-1].state if self.polls else None
            over = ended(latest) if latest is not None else None
            healthy = State.HEALTHY if code is ExitCode.OK else State.UNHEALTHY
            state = over if over is not None and over is not State.DEPLOYING else healthy
        raise _Finished(
            ProbeResult(
                verdict=verdict,
                exit_code=code,
                reason=reason,
                checks=self._all or self._results,
                polls=self.polls,
                duration=self.clock() - self._start,
                settings=self.settings,
                run=self.run_id,
                state=state,
            )
        )
