"""A run's whole life on the sandbox, with the demo trainer: finished (exit 0), starting (a long
model load), deploying (a deploy holds the lock), a freeze just before the warmup ends, and a
watcher's restart budget that belongs to the run it restarted. Real sshd, LXC and tmux."""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Iterator
from importlib import resources
from typing import Any

import jsonschema
import pytest

from tests.e2e.project import Project, json_out, verify_json
from tests.e2e.test_watch import Receiver, Watch, wait_until

pytestmark = pytest.mark.e2e

VMID = 203
STATUS_SCHEMA = json.loads(
    resources.files("launcher").joinpath("schemas/status.schema.json").read_text()
)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


def deploy(project: Project, name: str, **overrides: Any) -> None:
    project.write({name: (VMID, project.playbook(name, **overrides))})
    result = project.launcher("deploy", "--restart")
    assert result.returncode == 0, result.stdout + result.stderr


def status(project: Project) -> tuple[int, dict[str, Any]]:
    result = project.launcher("status", "--json")
    report = json_out(result)
    jsonschema.validate(report, STATUS_SCHEMA)
    return result.returncode, report


def test_a_run_that_finishes_before_it_was_judged_is_not_a_healthy_deploy(
    project: Project,
) -> None:
    # A debug max_steps left in the config: about 12 steps in 6 s, then "Training completed."
    # and exit 0, while the probe still counts its passing polls (20 asked for).
    deploy(project, "lshort", env={"DEMO_STEPS": "12"}, verify={"wait": 2, "window": 30,
           "successes": 20})  # fmt: skip
    code, report, _ = verify_json(project)
    assert code == 1, report
    assert report["state"] == "finished" and report["verdict"] == "unhealthy", report
    assert re.search(r"the run finished \(exit 0\) after \d+ s at step \d+, before it could "
                     r"be judged healthy", report["reason"]), report["reason"]  # fmt: skip
    # status is a snapshot, not a startup probe: the run is over and it ended well.
    code, doc = status(project)
    assert code == 0 and doc["state"] == "finished", doc


def test_a_run_meant_to_be_short_that_finishes_is_finished_exit_0(project: Project) -> None:
    verify = {"wait": 2, "window": 30, "successes": 20, "finish_ok": True}
    deploy(project, "lfinish", env={"DEMO_STEPS": "12"}, verify=verify)
    code, report, _ = verify_json(project)
    assert code == 0, report
    assert report["state"] == "finished" and report["verdict"] == "healthy", report
    assert report["schema"] == "launcher.verify/2"
    assert "finished (exit 0) at step" in report["reason"]
    # Once over, status says so too, and exit 0: terminal success, not a crash.
    code, doc = status(project)
    assert code == 0 and doc["state"] == "finished", doc
    text = project.launcher("status")
    assert text.returncode == 0 and "FINISHED (exit 0)" in text.stdout, text.stdout


def test_watch_reports_a_finished_run_once_and_never_restarts_it(
    project: Project, receiver: Receiver
) -> None:
    deploy(project, "lwfinish", env={"DEMO_STEPS": "8"}, verify={"wait": 1})
    watch = Watch(
        project, "-t", "lwfinish", "--webhook", receiver.url, "--restart-on-failure",
        "--restart-backoff", "0", "--interval", "1", "--for", "14",
    )  # fmt: skip
    try:
        assert watch.proc.wait(timeout=60) == 0, watch.stderr()
    finally:
        watch.kill()
    kinds = receiver.kinds()
    assert kinds.count("finished") == 1, kinds
    assert "restart" not in kinds and "unhealthy" not in kinds and "gave_up" not in kinds, kinds
    assert receiver.of("finished")[0][1]["status"] == "finished"


def test_status_during_a_long_model_load_is_starting(project: Project) -> None:
    # A 40 s load prints "Loading model..." and nothing else; the warmup is 60 s.
    deploy(project, "lload", env={"DEMO_LOAD_SECONDS": "40"}, verify={"wait": 60})
    code, doc = status(project)
    assert code == 0, doc
    assert doc["state"] == "starting" and doc["verdict"] == "healthy", doc
    assert "within its warmup" in doc["reason"]
    text = project.launcher("status")
    assert text.returncode == 0 and "STARTING (exit 0)" in text.stdout, text.stdout
    project.kill_session(VMID, "lload")


def test_status_while_a_deploy_holds_the_lock_is_deploying(project: Project) -> None:
    # The running trainer ignores C-c, so the next deploy holds the lock for its stop grace.
    env = {"DEMO_IGNORE_SIGINT": "1"}
    deploy(project, "llock", env=env, stop_grace=8)
    redeploy = subprocess.Popen(
        project.argv("deploy", "--restart"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    seen: list[dict[str, Any]] = []
    try:

        def deploying() -> bool:
            code, doc = status(project)
            seen.append(doc)
            return doc["state"] == "deploying" and code == 0

        project.wait_for(deploying, timeout=20, what="status: deploying")
    finally:
        assert redeploy.wait(timeout=60) == 0
    assert "a deploy is in progress" in seen[-1]["reason"]
    project.kill_session(VMID, "llock")


HANG, STALL = 4, 10  # the freeze, seconds after the start; step.stall_after


def test_a_freeze_just_before_the_warmup_ends_is_unhealthy_at_stall_after(
    project: Project,
) -> None:
    # Status lines every 0.3 s, then at second 4 nothing more (a rank hung in a collective);
    # the warmup ends at 6 s, after the 3 passing polls asked for. Healthy must mean
    # progressing now: the probe may only end unhealthy, when stall_after (10 s) has passed
    # since the last step (a probe that counted the warmup's passes would say healthy at 6 s).
    deploy(
        project,
        "lfreeze",
        env={"DEMO_MODE": "hang", "DEMO_HANG_AFTER": str(HANG), "DEMO_INTERVAL": "0.3"},
        verify={"wait": 6, "interval": 2, "window": 60, "successes": 3,
                "step": {"stall_after": STALL}},
    )  # fmt: skip
    started = time.monotonic()
    code, report, _ = verify_json(project)
    assert code == 1 and report["state"] == "unhealthy", report
    step = next(c for c in report["checks"] if c["name"] == "step")
    assert step["failure"] == "immediate" and "unchanged for" in step["observed"], step
    # The freeze began ~HANG s after the launch; the verdict comes at stall_after after it.
    assert time.monotonic() - started >= STALL - HANG, report["timings"]
    project.kill_session(VMID, "lfreeze")


def test_a_run_deployed_by_hand_after_a_give_up_gets_a_full_budget(
    project: Project, receiver: Receiver
) -> None:
    env = {"DEMO_MODE": "crash", "DEMO_CRASH_AFTER": "3"}
    deploy(project, "lbudget", env=env, verify={"wait": 1, "interval": 1})
    args = (
        "-t", "lbudget", "--webhook", receiver.url, "--restart-on-failure",
        "--max-restarts", "2", "--restart-backoff", "0", "--interval", "1",
    )  # fmt: skip
    first = Watch(project, *args, "--for", "90")
    try:
        wait_until(lambda: receiver.of("gave_up"), 80, "the give-up on run A", first)
        first.terminate()
    finally:
        first.kill()
    assert receiver.kinds().count("restart") == 2
    given_up = len(receiver.received)
    # A person deploys run B (it crashes too); the next watcher uses the same state file.
    result = project.launcher("deploy", "--restart")
    assert result.returncode == 0, result.stderr
    second = Watch(project, *args, "--for", "90")
    try:
        wait_until(lambda: len(receiver.of("gave_up")) == 2, 80, "the give-up on run B", second)
        second.terminate()
    finally:
        second.kill()
    later = receiver.received[given_up:]
    kinds = [body["kind"] for _, body in later]
    assert kinds.count("restart") == 2, kinds  # B's own budget, not what A used
    assert "2 restarts" in later[-1][1]["reason"]


def test_hf_trainer_dicts_without_the_bar_are_healthy(project: Project) -> None:
    # disable_tqdm=True: only {'loss': ..., 'grad_norm': ..., 'epoch': ...} lines. The epoch is
    # the progress; no rate and no queues are printed, and the playbook asks for neither.
    deploy(
        project,
        "lhfdicts",
        env={"DEMO_FORMAT": "hf", "DEMO_HF_BAR": "0"},
        status={"preset": "hf-trainer"},
    )
    code, report, _ = verify_json(project)
    assert code == 0 and report["state"] == "healthy", report
    checks = {c["name"]: c for c in report["checks"]}
    assert checks["step"]["verdict"] == "pass" and "epoch" in checks["step"]["observed"]
    assert checks["throughput"]["verdict"] == "skip", checks["throughput"]
    assert checks["queues.q_pre"]["verdict"] == "skip"
    junit = project.launcher("verify", "--junit", str(project.root / "junit.xml"))
    assert junit.returncode == 0, junit.stdout + junit.stderr
    assert "<skipped" in (project.root / "junit.xml").read_text()
    project.kill_session(VMID, "lhfdicts")


def test_a_run_stopped_by_a_person_is_stopped_and_the_watcher_leaves_it(
    project: Project, receiver: Receiver
) -> None:
    deploy(project, "lstop", verify={"wait": 1})
    watch = Watch(
        project, "-t", "lstop", "--webhook", receiver.url, "--restart-on-failure",
        "--restart-backoff", "0", "--interval", "1", "--for", "60",
    )  # fmt: skip
    try:
        wait_until(lambda: receiver.of("healthy") or "healthy" in watch.stderr(), 30,
                   "a healthy run", watch)  # fmt: skip
        stopped = project.launcher("stop")
        assert stopped.returncode == 0, stopped.stderr
        wait_until(lambda: receiver.of("stopped"), 20, "the stopped event", watch)
        time.sleep(4)  # no restart follows
        assert watch.terminate() == 0, watch.stderr()
    finally:
        watch.kill()
    kinds = receiver.kinds()
    assert "restart" not in kinds and "unhealthy" not in kinds, kinds
    code, doc = status(project)
    assert code == 1 and doc["state"] == "stopped", doc
    # The next deploy clears it: the new run is judged afresh.
    deploy(project, "lstop", verify={"wait": 1})
    project.wait_for(lambda: status(project)[1]["state"] == "healthy", 30, "a healthy run")
    project.kill_session(VMID, "lstop")
