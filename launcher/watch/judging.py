"""One target's runs judged poll after poll, for as long as the watcher runs.

The same engine as `verify` (`launcher.verify.checks.Judge`, one per run, fed every poll) under
the same policy (`launcher.verify.policy`): during the warmup only a crash, a fatal sign or a
restart counts; an immediate failure is unhealthy at once, a definite one after
`failure_threshold` failing polls in a row; `successes` passing polls in a row are healthy.
Unlike the probe it never ends: a run that is not healthy by the end of its window is
unhealthy, and a run that recovers (the step advances again) becomes healthy again.

Runs are never mixed: the run marker deploy sets (tmux option @launcher_run) names the run; a
new marker starts a new Judge. A restart inside one run (torchrun's elastic agent) makes the
run unhealthy once; then its judge starts afresh, so that the run can recover.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from launcher.verify.checks import Judge
from launcher.verify.lifecycle import State, ended, replacing
from launcher.verify.pane import PaneState, Poll
from launcher.verify.policy import Judgement, Tally, describe_failures, outcome
from launcher.verify.prober import ParseFn
from launcher.verify.results import CheckResult, Verdict
from launcher.verify.samples import Sample
from launcher.verify.spec import ChecksSpec
from launcher.watch.events import LAST_LINES


@dataclass(frozen=True)
class JudgeSettings:
    wait: float
    window: float
    successes: int
    failure_threshold: int
    lines: int
    interval: float | None = None  # seconds between polls: the step's cadence is judged by it


@dataclass
class Observation:
    """One poll, judged."""

    verdict: str  # healthy | unhealthy | pending | replacing | finished | stopped
    reason: str
    run: str | None
    step: int | None = None
    throughput: float | None = None
    loss: float | None = None
    queues: dict[str, list[float]] = field(default_factory=dict)  # depths (per bucket)
    fills: dict[str, float] = field(default_factory=dict)  # queues printed as `n/total`
    since_step: float | None = None
    last_lines: list[str] = field(default_factory=list)
    state: State | None = None  # failed for an unhealthy run that exited non-zero


def run_identity(state: PaneState) -> str | None:
    """The run marker; for a session launcher did not start, its pane's process."""
    if state.run:
        return state.run
    return f"pid {state.pane_pid}" if state.pane_pid is not None else None


def reason_of(failures: Sequence[CheckResult]) -> str:
    """One line: each failing check and its evidence, the most telling first (as verify)."""
    return describe_failures(failures) or "failing"


class RunJudge:
    def __init__(
        self, spec: ChecksSpec, settings: JudgeSettings, parse: ParseFn, queues: Sequence[str]
    ) -> None:
        self.spec = spec
        self.settings = settings
        self.parse = parse
        self.queue_names = list(queues)
        self.run: str | None = None
        self.judge: Judge | None = None
        self.started = 0.0
        self.ever_healthy = False
        self.tally = Tally(settings.failure_threshold)
        self._step: int | None = None
        self._step_at = 0.0
        self._numbers: tuple[float | None, float | None] = (None, None)
        self._queues: dict[str, list[float]] = {}
        self._fills: dict[str, float] = {}

    def _begin(self, run: str | None, now: float) -> None:
        self.run = run
        self.judge = Judge(
            self.spec,
            live=True,
            history_lines=self.settings.lines,
            interval=self.settings.interval,
        )
        self.started = now
        self.ever_healthy = False
        self.tally = Tally(self.settings.failure_threshold)
        self._step, self._step_at = None, now

    def observe(self, state: PaneState, now: float) -> Observation:
        identity = run_identity(state)
        lines = last_lines(state.capture)
        why = replacing(state)
        if why is not None:
            return Observation("replacing", why, self.run, last_lines=lines)
        if self.judge is None or (state.session_exists and identity != self.run):
            self._begin(identity, now)
        samples = tuple(self.parse(state.capture, state.pane_width))
        poll = Poll(at=now, state=state, samples=samples)
        assert self.judge is not None
        judging = now >= self.started + self.settings.wait
        results = self.judge.add(poll, warmup_over=judging)
        over = ended(state)
        if over in (State.FINISHED, State.STOPPED):
            # Over by design: never a reason to restart (see launcher.verify.lifecycle).
            reason = (
                f"the run finished (exit 0) at {self.judge.progress or 'its start'}"
                if over is State.FINISHED
                else "stopped by launcher stop"
            )
            observation = Observation(str(over), reason, self.run, last_lines=lines)
            self._numbers_from(samples, now, observation)
            return observation
        judged = self.tally.take(results, judging=judging)
        verdict, reason = self._verdict(results, judged, judging, now)
        observation = Observation(verdict, reason, self.run, last_lines=lines)
        if verdict == "unhealthy" and over is State.FAILED:
            observation.state = State.FAILED
        self._numbers_from(samples, now, observation)
        if verdict == "unhealthy" and judged.restarted:
            # Reported once; a fresh judge lets the restarted process prove itself.
            self._begin(self.run, now)
        return observation

    def _verdict(
        self,
        results: list[CheckResult],
        judged: Judgement,
        judging: bool,
        now: float,
    ) -> tuple[str, str]:
        # The window counts only until the run is first healthy (after that, a watch judges for
        # as long as the run lasts), and not while the run passes, on its way to healthy.
        end = self.started + self.settings.wait + self.settings.window
        found = outcome(
            judged,
            judging=judging,
            successes=self.settings.successes,
            window_over=not self.ever_healthy and now >= end and not judged.passing,
        )
        if found == "unhealthy":
            return "unhealthy", reason_of(judged.failures)
        if found == "healthy":
            self.ever_healthy = True
            return "healthy", f"{judged.passing} passing polls in a row"
        failing = [r for r in results if r.verdict is Verdict.FAIL]
        if found == "window over":
            return "unhealthy", "not healthy within the window: " + reason_of(failing)
        if not judging:
            return "pending", "warmup"
        if judged.passing:
            return "pending", f"{judged.passing} of {self.settings.successes} passing polls"
        return "pending", reason_of(failing)

    def _numbers_from(self, samples: Sequence[Sample], now: float, obs: Observation) -> None:
        """The newest step, throughput, loss and queues, and how long the step has held."""
        for sample in reversed(samples):
            if sample.step is not None:
                if sample.step != self._step:
                    self._step, self._step_at = sample.step, now
                self._numbers = (sample.throughput, sample.loss)
                for name in self.queue_names:
                    read = sample.queue(name)  # a list, a depth, or a fill (`12/16`)
                    if read is None:
                        continue
                    if read[0] == "fill":
                        self._fills[name] = read[1][0]
                    else:
                        self._queues[name] = read[1]
                break
        obs.step = self._step
        obs.throughput, obs.loss = self._numbers
        obs.queues = dict(self._queues)
        obs.fills = dict(self._fills)
        obs.since_step = now - self._step_at if self._step is not None else None
        if obs.loss is not None and math.isinf(obs.loss):
            obs.loss = None


def last_lines(capture: str, count: int = LAST_LINES) -> list[str]:
    lines = [line for line in capture.splitlines() if line.strip()]
    return lines[-count:]
