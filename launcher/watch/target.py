"""A target as a watch's subject: its pane polled and judged run by run (`RunJudge`), a crashed
run restarted as it was (the same script or release, command, environment and overrides, from
the spec kept in the container; its checkpoints left in place for its resume), or stopped."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from launcher.agent.protocol import SPEC_NOT_KEPT
from launcher.config.models import Target
from launcher.container.agentclient import container_for
from launcher.container.pct import HostConnection
from launcher.core.errors import RefusedError
from launcher.core.requests import DeployOptions
from launcher.deploy.deploy import deploy
from launcher.operate.rollback import RunBack, rollback
from launcher.operate.stop import stop
from launcher.probe.poll import poll_once
from launcher.probe.workflows import deployed_run, parser_for
from launcher.targets.fleet import connections_for
from launcher.verify.gpus import GpuSample
from launcher.watch.judging import JudgeSettings, Observation, RunJudge
from launcher.watch.metrics import Metrics
from launcher.watch.monitor import Note, WatchSettings

RESTART_OPTIONS = DeployOptions(restart=True, checkpoint_mode="keep")


@contextmanager
def target_subjects(
    targets: Sequence[Target], settings: WatchSettings
) -> Iterator[list[TargetSubject]]:
    """Each target as a subject, over one connection per host, closed when the watch ends."""
    with connections_for(targets) as connect:
        yield [TargetSubject(t, connect(t), settings) for t in targets]


class TargetSubject:
    restarted = "restarted as it was, checkpoints kept"

    def __init__(self, target: Target, conn: HostConnection, settings: WatchSettings) -> None:
        self.target = target
        self.conn = conn
        self.name, self.host, self.vmid = target.name, target.host_name, target.vmid
        self.series = (target.name, target.host_name, target.vmid)
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
        self.container = container_for(target, conn)
        self.deployed: dict[str, object] | None = None  # the latest deploy record polled
        self.session_age: float | None = None
        self.gpus: GpuSample | None = None

    def observe(self) -> Observation:
        state, answer = poll_once(self.container, self.target, self.spec.lines)
        self.deployed, self.session_age, self.gpus = answer.get("record"), state.age, state.gpus
        return self.runs.observe(state, time.monotonic())

    def export(self, metrics: Metrics) -> None:
        if self.gpus is not None:
            metrics.set_gpus(metrics.labels(*self.series), self.gpus)

    def hold(self, run: str | None) -> str | None:
        """A run deployed with --rollback-on-failure fails into that deploy's hands: it puts the
        previous run back, and a restart here would race it. Only while that deploy can still
        be probing (warmup + window + a minute since launch); after that, ours to recover."""
        record = self.deployed or {}
        if record.get("run") != run or not record.get("rollback_on_failure"):
            return None
        age = self.session_age
        if age is None or age > self.spec.wait + self.spec.window + 60:
            return None
        return "not restarted: its deploy (--rollback-on-failure) decides"

    def marker(self, run_id: str) -> str:
        return f"{self.target.playbook.spec.session}:{run_id}"

    def restart(self, run: str | None, count: int, of: int, run_id: str, note: Note) -> str | None:
        """The crashed run again, as it was: its script or release, command, env and overrides
        from the spec the container kept, its checkpoints left in place (never archived); the
        record says `restarted by watch (N/M)`. A run launched before specs were kept is
        redeployed from the playbook instead."""
        back = RunBack(
            to_run=run,
            relaunch=True,
            expect_run=run,
            restart_count=count,
            record={"restarted_by": f"watch ({count}/{of})"},
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
            options = dataclasses.replace(RESTART_OPTIONS, expect_run=run, run_id=run_id)
            return deployed_run(deploy(self.target, self.conn, options).to_json())
        return deployed_run(done.to_json())

    def after_restart(self, note: Note) -> None:
        """Nothing: the next polls judge the new run from its warmup on."""

    def stop(self, run: str | None) -> str:
        return stop(self.target, self.conn, expect_run=run).summary
