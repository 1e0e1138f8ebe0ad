"""`launcher job watch` is `launcher watch`'s session over one subject, the job: the same verdict
policy, restart budget and backoff, state file, events, receivers and metrics. The job's side
(its poll, redeploy, startup probe and stop) is scripted; a call the script does not expect
fails the test."""

from __future__ import annotations

import json
import os
import signal
import threading
from pathlib import Path
from typing import Any

import pytest

from launcher.config.models import load_inventory
from launcher.core.errors import ExitCode
from launcher.core.jobrequests import JobWatchRequest
from launcher.jobs.deploy import JobResult, NodeState
from launcher.jobs.job import load_job
from launcher.watch import job as watchjob
from launcher.watch import notify
from launcher.watch.job import JobSubject, terminated_by_sigterm, watch_job
from launcher.watch.metrics import Metrics
from launcher.watch.session import final_code
from launcher.watch.state import TargetRecord
from tests.unit.projectfiles import write_project

JOB = "jobs:\n  train:\n    nodes: [prod, staging]\n    playbook: playbooks/dflash.yaml\n"
OK = ("healthy", ExitCode.OK)
ALIVE = ("alive", ExitCode.OK)
DEAD = ("dead", ExitCode.UNHEALTHY)  # gone: unhealthy at once
SLOW = ("unhealthy", ExitCode.UNHEALTHY)  # the status rank judged unhealthy: counted in a row
LOST = ("unreachable", ExitCode.UNREACHABLE)
NEW = "(the run the watch launched)"


def poll(summary: str, *states: tuple[str, ExitCode], run: str = "R1") -> JobResult:
    result = JobResult("train", "status", summary, run_id=run)
    result.nodes = [
        NodeState(rank, name, name, word, f"{word} detail", code)
        for rank, (name, (word, code)) in enumerate(zip(("prod", "staging"), states, strict=True))
    ]
    return result


HEALTHY = poll("healthy: 2 node(s) in run R1", OK, ALIVE)
STAGING_DEAD = poll("unhealthy: staging (rank 1): the run exited (status 137)", OK, DEAD)


class Script:
    """The job's side of the watch: each poll's result in turn (the last one again once they
    are played, and the watch told to stop), the redeploys it may make, the stops."""

    def __init__(
        self,
        stop: threading.Event,
        polls: list[JobResult],
        *,
        deploys: list[bool] = [],  # noqa: B006  (read only) each redeploy: does it launch?
        stops: int = 0,
    ) -> None:
        self.stop, self.polls, self.deploys, self.stops = stop, list(polls), list(deploys), stops
        self.calls: list[str] = []
        self.unexpected: list[str] = []
        self.launched: str | None = None

    def fail(self, what: str) -> Any:
        self.unexpected.append(what)
        raise AssertionError(what)  # in the watch's thread: also kept in `unexpected`

    def status_job(self, job: object, nodes: object) -> JobResult:
        self.calls.append("poll")
        played = self.calls.count("poll")
        result = self.polls[min(played, len(self.polls)) - 1]
        if played >= len(self.polls):
            self.stop.set()  # played: the watch ends after this poll
        if result.run_id == NEW:
            result = poll(result.summary.replace(NEW, str(self.launched)), *self.states(result))
            result.run_id = self.launched
        return result

    @staticmethod
    def states(result: JobResult) -> list[tuple[str, ExitCode]]:
        return [(n.state, n.exit_code) for n in result.nodes]

    def deploy_job(self, job: object, nodes: object, options: Any, say: object) -> JobResult:
        if not self.deploys:
            return self.fail("redeployed: no restart was expected")  # type: ignore[no-any-return]
        if not (options.restart and options.checkpoint_mode == "keep" and options.run_id):
            self.fail(f"not a restart with checkpoints kept and a named run: {options}")
        self.calls.append("deploy")
        launches = self.deploys.pop(0)
        self.launched = options.run_id
        result = JobResult(
            "train", "deploy", f"launched run {options.run_id}", run_id=options.run_id
        )
        if not launches:
            result.summary = "nothing changed on any node: network: no route"
            result.nodes = [
                NodeState(0, "prod", "prod", "failed", "no route", ExitCode.UNREACHABLE)
            ]
        return result

    def verify_job(self, job: object, nodes: object, overrides: object, say: object) -> JobResult:
        if self.calls[-1:] != ["deploy"]:
            self.fail("probed without a redeploy")
        self.calls.append("probe")
        return JobResult("train", "verify", f"healthy: 2 node(s) in run {self.launched}")

    def stop_job(self, job: object, nodes: object, grace: object, say: object) -> JobResult:
        if not self.stops:
            return self.fail("stopped: the budget was not spent")  # type: ignore[no-any-return]
        self.stops -= 1
        self.calls.append("stop")
        return JobResult("train", "stop", "stopped 2 node(s)")


@pytest.fixture
def job(tmp_path: Path) -> Any:
    path = write_project(tmp_path)
    path.write_text(path.read_text() + JOB)
    return load_job(load_inventory(path), "train")


def play(
    monkeypatch: pytest.MonkeyPatch, script: Script, job: Any, options: JobWatchRequest
) -> tuple[watchjob.JobWatchResult, list[str]]:
    for name in ("status_job", "deploy_job", "verify_job", "stop_job"):
        monkeypatch.setattr(watchjob, name, getattr(script, name))
    lines: list[str] = []
    result = watch_job(
        job, None, options, say=lambda node, line: None, event=lines.append, stop=script.stop
    )  # type: ignore[arg-type]
    assert script.unexpected == []
    return result, lines


def options(tmp_path: Path, **fields: Any) -> JobWatchRequest:
    base: dict[str, Any] = {
        "name": "train",
        "interval": 0.01,
        "restart_backoff": 0.01,
        "state": str(tmp_path / "job.json"),
    }
    return JobWatchRequest(**{**base, **fields})


def events(tmp_path: Path) -> list[dict[str, Any]]:
    log = (tmp_path / "job.events.jsonl").read_text().splitlines()
    return [json.loads(line) for line in log]


def record(tmp_path: Path) -> TargetRecord:
    return TargetRecord(**json.loads((tmp_path / "job.json").read_text())["targets"]["train"])


def test_a_failed_job_is_redeployed_after_the_backoff_and_recovers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, job: Any
) -> None:
    """Every transition an event in the state's log (schema launcher.watch.event/1, the job as
    its target, the status rank's host and VMID); the restart counted in the state file, the
    run it launched named there; the next poll of that run is the recovery."""
    recovered = poll(f"healthy: 2 node(s) in run {NEW}", OK, ALIVE, run=NEW)
    script = Script(threading.Event(), [HEALTHY, STAGING_DEAD, recovered], deploys=[True])
    chosen = options(tmp_path, restart_on_failure=True, max_restarts=2, restart_backoff=0.02)
    result, lines = play(monkeypatch, script, job, chosen)
    assert script.calls[:5] == ["poll", "poll", "deploy", "probe", "poll"]
    logged = events(tmp_path)
    assert [e["kind"] for e in logged] == ["healthy", "unhealthy", "restart", "recovered"]
    assert {(e["schema"], e["target"], e["vmid"]) for e in logged} == {
        ("launcher.watch.event/1", "train", job.nodes[0].vmid)
    }
    assert logged[1]["reason"] == STAGING_DEAD.summary and logged[1]["previous"] == "healthy"
    assert logged[2]["run"] == script.launched and logged[2]["restarts"] == 1
    assert logged[2]["reason"].startswith("redeployed with checkpoints kept (restart 1 of 2")
    saved = record(tmp_path)
    assert (saved.status, saved.run, saved.launched) == (
        "healthy",
        script.launched,
        script.launched,
    )
    assert len(saved.restarts) == 1 and not saved.bad
    assert (result.exit_code, result.restarts, result.status) == (ExitCode.OK, 1, "healthy")
    said = [line.partition("job train: ")[2] for line in lines]
    assert said[:2] == [HEALTHY.summary, STAGING_DEAD.summary]
    assert "restarting in 0.02 s (backoff)" in said and "restarting the job (1/2)" in said
    assert f"after the restart: healthy: 2 node(s) in run {script.launched}" in said
    assert said[-1] == "watch ended by SIGTERM"


def test_the_budget_spent_the_job_is_stopped_and_the_watch_ends_unhealthy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, job: Any
) -> None:
    dead_again = poll("unhealthy: staging (rank 1): no session", OK, DEAD, run=NEW)
    polls = [HEALTHY, STAGING_DEAD, dead_again, dead_again]
    script = Script(threading.Event(), polls, deploys=[True], stops=1)
    chosen = options(tmp_path, restart_on_failure=True, max_restarts=1)
    play(monkeypatch, script, job, chosen)
    assert script.calls.count("deploy") == 1 and script.calls.count("stop") == 1
    logged = events(tmp_path)
    assert [e["kind"] for e in logged] == [
        "healthy",
        "unhealthy",
        "restart",
        "unhealthy",
        "gave_up",
    ]
    assert "1 restarts in 3600 s, the limit: left stopped" in logged[-1]["reason"]
    assert logged[-1]["reason"].endswith("; stopped 2 node(s)")
    saved = record(tmp_path)
    assert saved.status == "stopped" and saved.gave_up_run == saved.run == script.launched
    # What `--for` ending now would exit with: 1, the job left stopped by the watch.
    assert final_code({"train": saved}, ()) == ExitCode.UNHEALTHY


def test_a_redeploy_that_fails_is_tried_again_within_the_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, job: Any
) -> None:
    recovered = poll(f"healthy: 2 node(s) in run {NEW}", OK, ALIVE, run=NEW)
    polls = [HEALTHY, STAGING_DEAD, STAGING_DEAD, recovered]
    script = Script(threading.Event(), polls, deploys=[False, True])
    play(monkeypatch, script, job, options(tmp_path, restart_on_failure=True))
    logged = events(tmp_path)
    kinds = [e["kind"] for e in logged]
    assert kinds == ["healthy", "unhealthy", "restart", "restart", "recovered"]
    assert logged[2]["reason"] == (
        "restart 1 of 3 failed: nothing changed on any node: network: no route"
    )
    assert logged[2]["status"] == "unhealthy" and logged[3]["status"] == "restarting"
    assert len(record(tmp_path).restarts) == 2


def test_one_unhealthy_poll_is_not_a_failure_a_gone_node_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, job: Any
) -> None:
    """The verdict policy's counting: the status rank judged unhealthy once (definite) is no
    failure yet; twice in a row is. A node whose run is gone fails at once (above)."""
    slow = poll("unhealthy: prod (rank 0): step stalled", SLOW, ALIVE)
    script = Script(threading.Event(), [HEALTHY, slow, HEALTHY, slow, slow, slow])
    result, _ = play(monkeypatch, script, job, options(tmp_path))
    assert [e["kind"] for e in events(tmp_path)] == ["healthy", "unhealthy"]
    assert result.restarts == 0 and result.status == "unhealthy"


def test_an_unreachable_job_is_reported_after_three_polls_and_never_restarted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, job: Any
) -> None:
    lost = poll("unreachable: staging (rank 1): ssh: timed out", OK, LOST)
    script = Script(threading.Event(), [HEALTHY, lost, lost, lost, lost, HEALTHY])
    play(monkeypatch, script, job, options(tmp_path, restart_on_failure=True))
    logged = events(tmp_path)
    assert [e["kind"] for e in logged] == ["healthy", "unreachable", "reachable"]
    assert logged[1]["reason"] == f"3 polls in a row failed: {lost.summary}"


def test_a_job_someone_else_redeployed_is_a_new_run_with_a_budget_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, job: Any
) -> None:
    theirs = poll("healthy: 2 node(s) in run R9", OK, ALIVE, run="R9")
    script = Script(threading.Event(), [HEALTHY, theirs])
    play(monkeypatch, script, job, options(tmp_path, restart_on_failure=True))
    logged = events(tmp_path)
    assert [e["kind"] for e in logged] == ["healthy", "new_run", "healthy"]
    assert logged[1]["reason"] == "a new run replaced R1"


def test_a_finished_job_is_reported_once_and_never_restarted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, job: Any
) -> None:
    done = ("finished", ExitCode.OK)
    finished = poll("finished: 2 node(s) in run R1", done, done)
    script = Script(threading.Event(), [finished, finished, finished])
    result, lines = play(monkeypatch, script, job, options(tmp_path, restart_on_failure=True))
    assert [e["kind"] for e in events(tmp_path)] == ["finished"]
    assert lines[0].endswith("job train: finished: 2 node(s) in run R1")
    assert result.status == "finished" and result.restarts == 0


def test_sigterm_ends_a_job_watch_after_the_poll_under_way_and_restarts_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, job: Any
) -> None:
    """SIGTERM during a poll that finds a node gone: the change is reported, no restart
    begins, the watch ends with a last line and exit 0 (as `launcher watch` does)."""
    with terminated_by_sigterm() as stop:
        script = Script(stop, [STAGING_DEAD, STAGING_DEAD])
        polled = script.status_job

        def terminated(job_: object, nodes: object) -> JobResult:
            os.kill(os.getpid(), signal.SIGTERM)
            return polled(job_, nodes)

        script.status_job = terminated  # type: ignore[method-assign]
        chosen = options(tmp_path, restart_on_failure=True, restart_backoff=5)
        result, lines = play(monkeypatch, script, job, chosen)
    assert "deploy" not in script.calls and result.restarts == 0
    assert (result.exit_code, result.stopped) == (ExitCode.OK, True)
    assert lines[0].endswith("job train: unhealthy: staging (rank 1): the run exited (status 137)")
    assert lines[-1].endswith("job train: watch ended by SIGTERM")


def test_a_job_watch_sends_its_events_to_exec_as_a_target_watch_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, job: Any
) -> None:
    """--exec gets each event that is not quiet, in LAUNCHER_EVENT_* variables (the command
    itself faked here: a unit test starts no process)."""
    ran: list[dict[str, str]] = []

    def run(argv: list[str], *, env: dict[str, str], **kwargs: Any) -> Any:
        assert argv == ["notify-send", "launcher"], argv
        ran.append(env)
        return type("Done", (), {"returncode": 0, "stderr": b""})()

    monkeypatch.setattr(notify.subprocess, "run", run)
    script = Script(threading.Event(), [HEALTHY, STAGING_DEAD, STAGING_DEAD])
    chosen = options(tmp_path, commands=("notify-send launcher",))
    play(monkeypatch, script, job, chosen)
    # `healthy` is recorded, not sent; the unhealthy one is delivered before the watch ends.
    assert [(e["LAUNCHER_EVENT_KIND"], e["LAUNCHER_EVENT_TARGET"]) for e in ran] == [
        ("unhealthy", "train")
    ]
    assert json.loads((tmp_path / "job.json").read_text())["outbox"] == {}


def test_every_node_has_its_series_and_the_status_rank_carries_the_job(job: Any) -> None:
    from launcher.verify.gpus import GpuSample

    subject = JobSubject(job, None, JobWatchRequest(name="train"), lambda node, line: None)  # type: ignore[arg-type]
    polled = poll(STAGING_DEAD.summary, OK, DEAD)
    polled.gpus = {"staging": GpuSample(2, (0,), {0: 90}, {0: 100})}
    subject.last = polled
    metrics = Metrics()
    subject.export(metrics)
    staging, prod = job.nodes[1], job.nodes[0]
    labels = {"target": "staging", "host": staging.host_name, "vmid": str(staging.vmid)}
    value = metrics.registry.get_sample_value
    assert value("launcher_watch_status", {**labels, "status": "unhealthy"}) == 1.0
    assert value("launcher_gpu_held_by_run", {**labels, "gpu": "0"}) == 1.0
    rank0 = {"target": "prod", "host": prod.host_name, "vmid": str(prod.vmid)}
    assert value("launcher_watch_status", {**rank0, "status": "healthy"}) is None  # the job's
    assert subject.series == ("prod", prod.host_name, prod.vmid)
    assert (subject.name, subject.vmid) == ("train", prod.vmid)


def test_the_sigterm_handler_is_put_back() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with terminated_by_sigterm() as stop:
        assert not stop.is_set()
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.wait(5)
    assert signal.getsignal(signal.SIGTERM) == before
