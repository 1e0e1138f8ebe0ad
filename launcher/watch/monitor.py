"""The watcher: one thread per target (one SSH connection per host), one poll per interval.

Each poll is judged (`launcher.watch.judging`); only transitions become events: on stderr, in
the state's events log and, unless quiet, to every notification destination. With a restart
policy an unhealthy run is restarted as it was (the same script or release, command, environment
and overrides, from the spec kept in the container; its checkpoints left in place for its resume)
after a backoff, at most
`max_restarts` times in the window; then it is left stopped with a final event. Unreachable is
reported, never a reason to restart; nor is a CT frozen or locked by a backup (paused, not
down), nor what the judge makes of the first polls after it thawed (the run stood still too).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from launcher.agent.protocol import RUN_REPLACED, SPEC_NOT_KEPT
from launcher.config.models import Target
from launcher.container.agentclient import container_for
from launcher.container.pct import HostConnection
from launcher.core.errors import LauncherError, PausedError, RefusedError, RemoteError
from launcher.core.runid import new_run_id
from launcher.deploy.deploy import DeployOptions, deploy
from launcher.operate.rollback import RunBack, rollback
from launcher.operate.stop import stop
from launcher.probe.poll import poll_once
from launcher.probe.workflows import deployed_run, parser_for
from launcher.verify.lifecycle import State
from launcher.verify.prober import UNREACHABLE_LIMIT
from launcher.watch.events import QUIET_KINDS, Event
from launcher.watch.judging import JudgeSettings, Observation, RunJudge
from launcher.watch.metrics import Metrics
from launcher.watch.notify import Notifier
from launcher.watch.policy import RestartPolicy
from launcher.watch.state import TargetRecord, WatchState

RESTART_OPTIONS = DeployOptions(restart=True, checkpoint_mode="keep")
# The statuses from which an unhealthy verdict is a transition (not from unhealthy or stopped).
JUDGED = ("starting", "healthy", "restarting")
# The statuses of a run that needs recovering (a restarted watcher picks it up where it was).
DOWN = ("unhealthy", "failed")
# After a pause (a frozen CT), unhealthy verdicts are not acted on for this many intervals (at
# least SETTLE_MIN s): the run's log and steps stood still while it was frozen.
SETTLE_INTERVALS = 3
SETTLE_MIN = 30.0


@dataclass(frozen=True)
class WatchSettings:
    interval: float | None = None  # None: the playbook's verify.interval
    wait: float | None = None  # None: the playbook's verify.wait
    restart: bool = False
    policy: RestartPolicy = field(default_factory=RestartPolicy)


class Hub:
    """Where a target's events and numbers go: the state, the notifier, stderr, the metrics."""

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


class TargetWatch:
    def __init__(
        self,
        target: Target,
        conn: HostConnection,
        settings: WatchSettings,
        hub: Hub,
        stopping: threading.Event,
    ) -> None:
        self.target = target
        self.conn = conn
        self.settings = settings
        self.hub = hub
        self.stopping = stopping
        v = target.playbook.spec.verify
        self.spec = v
        self.interval = v.interval if settings.interval is None else settings.interval
        wait = v.wait if settings.wait is None else settings.wait
        self.runs = RunJudge(
            v,
            JudgeSettings(wait, v.window, v.successes, v.failure_threshold, v.lines, self.interval),
            parser_for(target),
            list(v.queues),
        )
        self.record = hub.state.record(target.name)
        self.runs.expected = self.record.launched
        self.container = container_for(target, conn)
        self.labels = (
            hub.metrics.labels(target.name, target.host_name, target.vmid) if hub.metrics else {}
        )
        self.unreachable = 0
        self.paused = False
        self.settle_until = 0.0
        # A watcher restarted while a run was down picks the recovery up where it was.
        self.restart_due = self.record.status in DOWN and (
            self.record.gave_up_run != self.record.run
        )
        self.last_reason = ""
        self.polls = 0
        self.deployed: dict[str, object] | None = None  # the latest deploy record polled
        self.session_age: float | None = None
        self.deferred: str | None = None  # the run whose failure was left to its deploy

    # -- the loop -------------------------------------------------------------------------

    def run(self) -> None:
        next_at = time.monotonic()
        while not self.stopping.is_set():
            self.poll_and_judge()
            if self.restart_due and self.settings.restart:
                self.recover()
            next_at = max(next_at + self.interval, time.monotonic())
            self.stopping.wait(next_at - time.monotonic())

    def poll_and_judge(self) -> None:
        started = time.monotonic()
        try:
            state, answer = poll_once(self.container, self.target, self.spec.lines)
        except PausedError as error:
            self._metrics_poll(time.monotonic() - started, ok=False)
            self.on_paused(error.message)
            return
        except RemoteError as error:
            self._metrics_poll(time.monotonic() - started, ok=False)
            self.on_unreachable(error.message)
            return
        self.polls += 1
        self._metrics_poll(time.monotonic() - started, ok=True)
        if not self.record.reachable:
            self.record.reachable = True
            self.transition("reachable", self.record.status, "answering polls again")
        self.unreachable = 0
        if self.paused:
            self.paused = False
            settle = max(SETTLE_INTERVALS * self.interval, SETTLE_MIN)
            self.settle_until = time.monotonic() + settle
            self.transition("resumed", self.record.status, "the CT answers again")
        self.deployed, self.session_age = answer.get("record"), state.age
        obs = self.runs.observe(state, time.monotonic())
        if self.hub.metrics is not None and state.gpus is not None:
            self.hub.metrics.set_gpus(self.labels, state.gpus)
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
        ours = obs.run is not None and obs.run == self.runs.expected
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
            self.hub.state.update(self.target.name, self.record)

    # -- recovery -------------------------------------------------------------------------

    def left_to_its_deploy(self) -> bool:
        """A run deployed with --rollback-on-failure fails into that deploy's hands: it puts the
        previous run back, and a restart here would race it. Only while that deploy can still
        be probing (warmup + window + a minute since launch); after that, ours to recover."""
        record = self.deployed or {}
        if record.get("run") != self.record.run or not record.get("rollback_on_failure"):
            return False
        age = self.session_age
        if age is None or age > self.spec.wait + self.spec.window + 60:
            return False
        if self.deferred != self.record.run:
            self.deferred = self.record.run
            self.hub.say(self._note("not restarted: its deploy (--rollback-on-failure) decides"))
        return True

    def recover(self) -> None:
        """Restart the same run, within the policy; or leave the run stopped."""
        policy = self.settings.policy
        now = time.time()
        if not self.record.reachable or self.paused:
            return  # unreachable or paused (a backup) is never a reason to restart
        if self.left_to_its_deploy():
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
        self.runs.expected = self.record.launched = f"{self.target.playbook.spec.session}:{run_id}"
        self.hub.state.update(self.target.name, self.record)
        # Only the crashed run is replaced: a second watcher (any state file) that saw the same
        # crash is refused in the container, under the deploy lock, once the first replaced it.
        try:
            launched = self.restart_same_run(count, run_id)
        except RefusedError as error:
            if self.record.run is not None and RUN_REPLACED in error.message:
                self.record.restarts = self.record.restarts[:-1]  # not ours: not counted
                self.restart_due = False
                self.hub.state.update(self.target.name, self.record)
                self.hub.say(self._note(f"restart not needed: {error.message}"))
                return
            self.transition(
                "restart",
                "unhealthy",
                f"restart {count} of {policy.max_restarts} failed: {error.message}",
            )
            return
        except LauncherError as error:
            self.transition(
                "restart",
                "unhealthy",
                f"restart {count} of {policy.max_restarts} failed: {error.message}",
            )
            return
        self.restart_due = False
        self.runs.expected = self.record.launched = launched
        reason = (
            f"restarted as it was, checkpoints kept (restart {count} of {policy.max_restarts} "
            f"in {policy.window:g} s) after: {self.last_reason}"
        )
        self.transition("restart", "restarting", reason, run=self.runs.expected)

    def restart_same_run(self, count: int, run_id: str) -> str | None:
        """The crashed run again, as it was: its script or release, command, env and overrides
        from the spec the container kept, its checkpoints left in place (never archived); the
        record says `restarted by watch (N/M)`. A run launched before specs were kept is
        redeployed from the playbook instead. `run_id`: the new run's, written to the state
        file before this call. Returns the new run's marker."""
        by = f"watch ({count}/{self.settings.policy.max_restarts})"
        back = RunBack(
            to_run=self.record.run,
            relaunch=True,
            expect_run=self.record.run,
            restart_count=count,
            record={"restarted_by": by},
        )
        try:
            done = rollback(
                self.target,
                self.conn,
                restart=True,
                keep_checkpoints=True,
                back=back,
                run_id=run_id,
            )
        except RefusedError as error:
            if SPEC_NOT_KEPT not in error.message:
                raise
            options = dataclasses.replace(
                RESTART_OPTIONS, expect_run=self.record.run, run_id=run_id
            )
            return deployed_run(deploy(self.target, self.conn, options).to_json())
        return deployed_run(done.to_json())

    def give_up(self) -> None:
        self.restart_due = False
        run = self.record.run
        self.record.gave_up_run = run
        note = ""
        try:
            # The run it gave up on, not one someone deployed meanwhile.
            stopped = stop(self.target, self.conn, expect_run=run)
            note = f"; {stopped.summary}"
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
        self.hub.state.update(self.target.name, self.record)
        latest = obs or getattr(self, "last_obs", None)
        event = Event(
            kind=kind,
            target=self.target.name,
            host=self.target.host_name,
            vmid=self.target.vmid,
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
            target=self.target.name,
            host=self.target.host_name,
            vmid=self.target.vmid,
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
    """Every target's watch in its own thread, over one connection per host, until stopped."""

    def __init__(
        self,
        targets: list[Target],
        settings: WatchSettings,
        hub: Hub,
        connect: Callable[[Target], HostConnection],
    ) -> None:
        self.targets = targets
        self.settings = settings
        self.hub = hub
        self.connect = connect
        self.stopping = threading.Event()
        self.watches: list[TargetWatch] = []
        self.errors: list[str] = []

    def run(self, duration: float | None = None) -> None:
        """Watch until `duration` passes or `stop()` is called (a signal handler may)."""
        threads = []
        for target in self.targets:
            watch = TargetWatch(
                target, self.connect(target), self.settings, self.hub, self.stopping
            )
            self.watches.append(watch)
            thread = threading.Thread(
                target=self._guarded, args=(watch,), name=f"watch-{target.name}", daemon=True
            )
            threads.append(thread)
            thread.start()
        end = None if duration is None else time.monotonic() + duration
        try:
            # Short waits keep the main thread responsive to Ctrl-C.
            while not self.stopping.is_set():
                left = 0.5 if end is None else min(0.5, end - time.monotonic())
                if left <= 0:
                    break
                self.stopping.wait(left)
        finally:
            self.stopping.set()
            for thread in threads:
                thread.join(timeout=60)

    def _guarded(self, watch: TargetWatch) -> None:
        try:
            watch.run()
        except Exception as error:  # one target's bug must not end the others' watch
            self.errors.append(f"{watch.target.name}: {type(error).__name__}: {error}")
            self.hub.say(watch._note(f"watch of this target ended: {error}"))

    def stop(self) -> None:
        self.stopping.set()

    def statuses(self) -> dict[str, TargetRecord]:
        return {w.target.name: w.record for w in self.watches}
