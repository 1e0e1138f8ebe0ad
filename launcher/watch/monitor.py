"""The watcher: one thread per subject (a target, or a multi-node job), one poll per interval.

A subject (`Subject`) is what is polled and restarted: a target's run (`launcher.watch.target`)
or a job's (`launcher.watch.job`). The rest is one machinery for both: each poll is judged into
an `Observation` (`launcher.watch.judging`); only transitions become events: on stderr, in the
state's events log and, unless quiet, to every notification destination. With a restart policy
an unhealthy run is restarted by its subject (checkpoints kept, so that it resumes) after a
backoff, at most `max_restarts` times in the window; then it is left stopped with a final
event. Unreachable is reported, never a reason to restart; nor is a CT frozen or locked by a
backup (paused, not down), nor what the judge makes of the first polls after it thawed (the
run stood still too).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from launcher.agent.protocol import RUN_REPLACED
from launcher.core.errors import LauncherError, PausedError, RefusedError, RemoteError
from launcher.core.runid import new_run_id
from launcher.verify.lifecycle import State
from launcher.verify.prober import UNREACHABLE_LIMIT
from launcher.watch.events import QUIET_KINDS, Event
from launcher.watch.judging import Observation
from launcher.watch.metrics import Metrics
from launcher.watch.notify import Notifier
from launcher.watch.policy import RestartPolicy
from launcher.watch.state import TargetRecord, WatchState

# The statuses from which an unhealthy verdict is a transition (not from unhealthy or stopped).
JUDGED = ("starting", "healthy", "restarting")
# The statuses of a run that needs recovering (a restarted watcher picks it up where it was).
DOWN = ("unhealthy", "failed")
# After a pause (a frozen CT), unhealthy verdicts are not acted on for this many intervals (at
# least SETTLE_MIN s): the run's log and steps stood still while it was frozen.
SETTLE_INTERVALS = 3
SETTLE_MIN = 30.0
# How long the end of a watch waits for a subject's poll; a restart under way is waited for
# whatever it takes (a redeploy is not left half-done).
JOIN_SECONDS = 60.0

Note = Callable[[str], None]


@dataclass(frozen=True)
class WatchSettings:
    interval: float | None = None  # None: the playbook's verify.interval
    wait: float | None = None  # None: the playbook's verify.wait
    restart: bool = False
    policy: RestartPolicy = field(default_factory=RestartPolicy)


class Subject(Protocol):
    """What one watch polls and restarts. `name`, `host` and `vmid` name it in events and in
    the state file; `series` (target, host, vmid) labels its metrics."""

    name: str
    host: str
    vmid: int
    series: tuple[str, str, int]
    interval: float
    restarted: str  # how a restart's event says what was done

    def observe(self) -> Observation:
        """One poll, judged; RemoteError: unreachable, PausedError: paused."""

    def export(self, metrics: Metrics) -> None:
        """What the last poll saw beyond its observation (GPUs, a job's other nodes)."""

    def hold(self, run: str | None) -> str | None:
        """Why the down run `run` is not this watch's to restart now (None: it is)."""

    def marker(self, run_id: str) -> str:
        """The run marker a restart with this run id launches."""

    def restart(self, run: str | None, count: int, of: int, run_id: str, note: Note) -> str | None:
        """Restart the crashed run `run` with its checkpoints kept, as run `run_id`; the
        marker it launched. Raises LauncherError when it failed."""

    def after_restart(self, note: Note) -> None:
        """What follows a restart that launched (a job's startup probe)."""

    def stop(self, run: str | None) -> str:
        """Stop the run `run` given up on (not one deployed since); what was done."""


class Hub:
    """Where a subject's events and numbers go: the state, the notifier, stderr, the metrics."""

    def __init__(
        self,
        state: WatchState,
        notifier: Notifier | None,
        metrics: Metrics | None,
        say: Callable[[Event], None],
    ) -> None:
        self.state = state
        self.notifier = notifier
        self.metrics = metrics
        self.say = say

    def emit(self, event: Event) -> None:
        event = event.capped()  # a 300 KB pane line goes nowhere whole: log, stderr, receivers
        quiet = event.kind in QUIET_KINDS or self.notifier is None
        destinations = [] if quiet else self.notifier.names  # type: ignore[union-attr]
        self.state.add_event(event, destinations)  # persisted before it is sent
        self.say(event)
        if destinations and self.notifier is not None:
            self.notifier.send(event)


class Watch:
    """One subject's watch: its record in the state file, its transitions, its restarts."""

    def __init__(
        self, subject: Subject, settings: WatchSettings, hub: Hub, stopping: threading.Event
    ) -> None:
        self.subject = subject
        self.settings = settings
        self.hub = hub
        self.stopping = stopping
        self.record = hub.state.record(subject.name)
        self.labels = hub.metrics.labels(*subject.series) if hub.metrics else {}
        self.unreachable = 0
        self.paused = False
        self.settle_until = 0.0
        # A watcher restarted while a run was down picks the recovery up where it was.
        self.restart_due = self.record.status in DOWN and (
            self.record.gave_up_run != self.record.run
        )
        self.restarting = False  # a restart is under way: the end of the watch waits for it
        self.last_reason = ""
        self.last_obs: Observation | None = None
        self.deferred: str | None = None  # the run whose failure was left to someone else

    # -- the loop -------------------------------------------------------------------------

    def run(self) -> None:
        next_at = time.monotonic()
        while not self.stopping.is_set():
            self.poll_and_judge()
            if self.restart_due and self.settings.restart:
                self.recover()
            next_at = max(next_at + self.subject.interval, time.monotonic())
            self.stopping.wait(next_at - time.monotonic())

    def poll_and_judge(self) -> None:
        started = time.monotonic()
        try:
            obs = self.subject.observe()
        except PausedError as error:
            self._metrics_poll(time.monotonic() - started, ok=False)
            self.on_paused(error.message)
            return
        except RemoteError as error:
            self._metrics_poll(time.monotonic() - started, ok=False)
            self.on_unreachable(error.message)
            return
        self._metrics_poll(time.monotonic() - started, ok=True)
        if not self.record.reachable:
            self.record.reachable = True
            self.transition("reachable", self.record.status, "answering polls again")
        self.unreachable = 0
        if self.paused:
            self.paused = False
            settle = max(SETTLE_INTERVALS * self.subject.interval, SETTLE_MIN)
            self.settle_until = time.monotonic() + settle
            self.transition("resumed", self.record.status, "the CT answers again")
        if self.hub.metrics is not None:
            self.subject.export(self.hub.metrics)
        self.on_observation(obs)

    def on_unreachable(self, message: str) -> None:
        self.unreachable += 1
        if self.unreachable >= UNREACHABLE_LIMIT and self.record.reachable:
            self.record.reachable = False
            reason = f"{self.unreachable} polls in a row failed: {message}"
            self.transition("unreachable", self.record.status, reason, metrics="unreachable")

    def on_paused(self, message: str) -> None:
        """A frozen or backup-locked CT: reported once, never a failure, never restarted."""
        self.unreachable = 0
        if not self.paused:
            self.paused = True
            self.transition("paused", self.record.status, message, metrics="paused")

    def on_observation(self, obs: Observation) -> None:
        self.last_obs = obs
        if self.hub.metrics is not None:
            self.hub.metrics.set_sample(
                self.labels,
                step=obs.step,
                throughput=obs.throughput,
                loss=obs.loss,
                queues=obs.queues,
                fills=obs.fills,
                since_step=obs.since_step,
            )
        if obs.run != self.record.run and obs.verdict != "replacing":
            self.on_new_run(obs)
        if obs.verdict == "healthy" and self.record.status != "healthy":
            kind = "recovered" if self.record.bad else "healthy"
            self.restart_due = self.record.bad = False
            self.transition(kind, "healthy", obs.reason, obs)
        elif obs.verdict == "unhealthy" and time.monotonic() < self.settle_until:
            pass  # just thawed: its log and steps stood still with it
        elif obs.verdict == "unhealthy" and self.record.status in JUDGED:
            self.last_reason = obs.reason
            self.record.bad = True
            self.restart_due = self.record.gave_up_run != obs.run
            status = "failed" if obs.state is State.FAILED else "unhealthy"
            self.transition("unhealthy", status, obs.reason, obs)
        elif obs.verdict in ("finished", "stopped") and self.record.status != obs.verdict:
            # Reported once; a finished or stopped run is never restarted.
            self.restart_due = self.record.bad = False
            self.transition(obs.verdict, obs.verdict, obs.reason, obs)
        self._metrics_status()

    def on_new_run(self, obs: Observation) -> None:
        previous_run = self.record.run
        self.record.run = obs.run
        ours = obs.run is not None and obs.run == self.record.launched
        self.record.status = "restarting" if ours else "starting"
        if not ours:
            # A run the watcher did not deploy has a budget of its own (Kubernetes keeps a
            # restartCount per pod): the restarts made for the run it replaced do not count.
            self.record.restarts = []
        if previous_run is not None and not ours:
            self.restart_due = False  # someone else deployed: theirs to judge, not ours to fix
            reason = f"a new run replaced {previous_run}"
            self.transition("new_run", self.record.status, reason, obs)
        else:
            self.hub.state.update(self.subject.name, self.record)

    # -- recovery -------------------------------------------------------------------------

    def recover(self) -> None:
        """Restart the run, within the policy; or leave it stopped."""
        policy = self.settings.policy
        now = time.time()
        if self.stopping.is_set() or not self.record.reachable or self.paused:
            return  # ending, unreachable or paused (a backup): never a reason to restart
        held = self.subject.hold(self.record.run)
        if held is not None:
            if self.deferred != self.record.run:
                self.deferred = self.record.run
                self.hub.say(self._note(held))
            return
        if not policy.allowed(self.record.restarts, now):
            self.give_up()
            return
        delay = policy.delay(self.record.restarts, now)
        self.hub.say(self._note(f"restarting in {delay:g} s (backoff)"))
        if self.stopping.wait(delay):
            return
        self.record.restarts = [*policy.recent(self.record.restarts, now), time.time()]
        self.record.status = "restarting"
        count = len(self.record.restarts)
        # Counted, and the run it launches named, before it starts: a watcher killed at any
        # point of the restart leaves the next one (same state file) the count and that run
        # as its own, not a stranger's run with a fresh budget.
        run_id = new_run_id()
        self.record.launched = self.subject.marker(run_id)
        self.hub.state.update(self.subject.name, self.record)
        note: Note = lambda text: self.hub.say(self._note(text))  # noqa: E731
        self.restarting = True
        try:
            launched = self.subject.restart(
                self.record.run, count, policy.max_restarts, run_id, note
            )
        except LauncherError as error:
            # Only the crashed run is replaced: a second watcher (any state file) that saw the
            # same crash is refused in the container, under the deploy lock, once the first
            # replaced it.
            replaced = isinstance(error, RefusedError) and RUN_REPLACED in error.message
            if replaced and self.record.run is not None:
                self.record.restarts = self.record.restarts[:-1]  # not ours: not counted
                self.restart_due = False
                self.hub.state.update(self.subject.name, self.record)
                self.hub.say(self._note(f"restart not needed: {error.message}"))
                return
            why = f"restart {count} of {policy.max_restarts} failed: {error.message}"
            self.transition("restart", "unhealthy", why)
            return
        finally:
            self.restarting = False
        self.restart_due = False
        self.record.launched = launched
        reason = (
            f"{self.subject.restarted} (restart {count} of {policy.max_restarts} "
            f"in {policy.window:g} s) after: {self.last_reason}"
        )
        self.transition("restart", "restarting", reason, run=launched)
        self.subject.after_restart(note)

    def give_up(self) -> None:
        self.restart_due = False
        run = self.record.run
        self.record.gave_up_run = run
        try:
            note = f"; {self.subject.stop(run)}"  # the run given up on, not a newer one
        except LauncherError as error:
            note = f"; stopping it failed: {error.message}"
        policy = self.settings.policy
        reason = (
            f"{len(self.record.restarts)} restarts in {policy.window:g} s, the limit: "
            f"left stopped after: {self.last_reason}{note}"
        )
        self.transition("gave_up", "stopped", reason)

    # -- plumbing -------------------------------------------------------------------------

    def transition(
        self,
        kind: str,
        status: str,
        reason: str,
        obs: Observation | None = None,
        *,
        run: str | None = None,
        metrics: str | None = None,
    ) -> None:
        previous = self.record.status
        self.record.status = status
        self.hub.state.update(self.subject.name, self.record)
        latest = obs or self.last_obs
        subject = self.subject
        event = Event(
            kind=kind,
            target=subject.name,
            host=subject.host,
            vmid=subject.vmid,
            run=run or self.record.run,
            status=status,
            previous=previous,
            reason=reason,
            last_lines=latest.last_lines if latest and kind != "reachable" else [],
            step=latest.step if latest else None,
            restarts=len(self.settings.policy.recent(self.record.restarts, time.time())),
        )
        self.hub.emit(event)
        self._metrics_status(metrics)
        if kind == "restart" and self.hub.metrics is not None:
            self.hub.metrics.restarts.labels(**self.labels).inc()

    def _note(self, text: str) -> Event:
        """A line for stderr only (not a transition)."""
        return Event(
            kind="note",
            target=self.subject.name,
            host=self.subject.host,
            vmid=self.subject.vmid,
            run=self.record.run,
            status=self.record.status,
            previous=self.record.status,
            reason=text,
        )

    def _metrics_status(self, override: str | None = None) -> None:
        if self.hub.metrics is not None:
            status = override or (self.record.status if self.record.reachable else "unreachable")
            self.hub.metrics.set_status(self.labels, status)

    def _metrics_poll(self, seconds: float, *, ok: bool) -> None:
        if self.hub.metrics is not None:
            self.hub.metrics.set_poll(self.labels, seconds, ok)


class Watcher:
    """Every subject's watch in its own thread, until its duration passes or `stop` is set."""

    def __init__(self, subjects: Sequence[Subject], settings: WatchSettings, hub: Hub) -> None:
        self.subjects = list(subjects)
        self.settings = settings
        self.hub = hub
        self.stopping = threading.Event()
        self.watches: list[Watch] = []
        self.errors: list[str] = []

    def run(self, duration: float | None, stop: threading.Event) -> None:
        """Watch until `duration` passes or `stop` is set (a signal handler may set it)."""
        if stop.is_set():
            self.stopping.set()  # stopped before it began: no subject is polled
        threads = []
        for subject in self.subjects:
            watch = Watch(subject, self.settings, self.hub, self.stopping)
            self.watches.append(watch)
            thread = threading.Thread(
                target=self._guarded, args=(watch,), name=f"watch-{subject.name}", daemon=True
            )
            threads.append(thread)
            thread.start()
        end = None if duration is None else time.monotonic() + duration
        try:
            # Short waits keep the main thread responsive to Ctrl-C.
            while not stop.is_set() and not self.stopping.is_set():
                left = 0.5 if end is None else min(0.5, end - time.monotonic())
                if left <= 0:
                    break
                stop.wait(left)
        finally:
            self.stopping.set()
            for watch, thread in zip(self.watches, threads, strict=True):
                thread.join(timeout=JOIN_SECONDS)
                while thread.is_alive() and watch.restarting:
                    thread.join(timeout=1.0)

    def _guarded(self, watch: Watch) -> None:
        try:
            watch.run()
        except Exception as error:  # one subject's bug must not end the others' watch
            self.errors.append(f"{watch.subject.name}: {type(error).__name__}: {error}")
            self.hub.say(watch._note(f"watch of this target ended: {error}"))

    def stop(self) -> None:
        self.stopping.set()

    def statuses(self) -> dict[str, TargetRecord]:
        return {w.subject.name: w.record for w in self.watches}
