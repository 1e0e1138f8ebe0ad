"""Verdicts end to end: the healthy kinds of run pass (a plateau with noise and finaliser
tracebacks, bursty queues on a slow warmup, one resume at the start), and a deploy that replaces
the run while verify polls fails it. How soon each kind of broken run fails, and a hung `pct`
that must not hold verify or status past their deadlines: tests/timing/test_verdict_deadlines.py.
"""

from __future__ import annotations

import json
import re
import subprocess
from importlib import resources
from typing import Any

import jsonschema
import pytest

from tests.e2e.project import Project, verify_json

pytestmark = pytest.mark.e2e

VMID = 202
SCHEMA = json.loads(resources.files("launcher").joinpath("schemas/verify.schema.json").read_text())
WAIT, INTERVAL, THRESHOLD = 3.0, 1.0, 3
PROBE = {"wait": WAIT, "interval": INTERVAL, "failure_threshold": THRESHOLD, "window": 20}
# Round trips of the polls (a busy machine makes them slower than the interval).
SLACK = 4.0


def deploy(project: Project, name: str, *args: str, **overrides: Any) -> None:
    verify = {**PROBE, **overrides.pop("verify", {})}
    project.write({name: (VMID, project.playbook(name, verify=verify, **overrides))})
    result = project.launcher("deploy", "--restart", *args)
    assert result.returncode == 0, result.stdout + result.stderr


def verify(project: Project, *args: str) -> tuple[int, dict[str, Any], float]:
    return verify_json(project, *args)


def checks(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in report["checks"]}


def test_plateau_with_finaliser_noise_is_healthy(project: Project) -> None:
    deploy(project, "noise", env={"DEMO_MODE": "finalizer-noise", "DEMO_NOISE_EVERY": "1.5"})
    code, report, _ = verify(project)
    assert code == 0, report["reason"]
    fatal = checks(report)["fatal"]
    assert fatal["verdict"] == "warn"
    assert fatal["observed"].startswith("finaliser noise, harmless: Exception ignored in")
    assert checks(report)["throughput"]["verdict"] == "pass"
    project.kill_session(VMID, "noise")


def test_bursty_queues_on_a_slow_warmup_are_healthy(project: Project) -> None:
    # The ramp takes ~10 s: at the warmup's end throughput is still below the floor but rising.
    env = {"DEMO_MODE": "bursty", "DEMO_RAMP": "10"}
    deploy(project, "bursty", env=env, verify={"throughput": {"min": "22Ktok/s"}})
    code, report, elapsed = verify(project)
    assert code == 0, report["reason"]
    assert elapsed > WAIT + 1  # it had to wait for the floor
    assert checks(report)["queues.q_pre"]["verdict"] == "pass"
    project.kill_session(VMID, "bursty")


def test_one_resume_from_a_checkpoint_at_the_start_is_healthy(project: Project) -> None:
    deploy(project, "resume", env={"DEMO_CHECKPOINT_EVERY": "2"})
    project.wait_for(
        lambda: "step_" in project.ct_text(VMID, "ls", "/root/resume/checkpoints"),
        what="a checkpoint",
    )
    deploy(project, "resume", "--keep-checkpoints", env={"DEMO_RESUME": "1"})
    code, report, _ = verify(project)
    assert code == 0, report["reason"]
    assert checks(report)["restarts"]["verdict"] == "pass"
    log = project.ct_text(VMID, "cat", "/root/resume/.launcher/resume.log")
    assert "Resuming from checkpoints/step_" in log
    project.kill_session(VMID, "resume")


def test_a_silent_hang_fails_at_hang_after_not_stall_after(project: Project) -> None:
    """A hung collective (pane alive, nothing printed, nothing written) is called at
    step.hang_after, long before the step's stall_after would."""
    step = {"stall_after": 60, "hang_after": 2}
    env = {"DEMO_MODE": "hang", "DEMO_HANG_AFTER": "4"}
    # 8 passing polls to be healthy: more than the run has before it hangs.
    deploy(project, "hang", env=env, verify={"step": step, "successes": 8})
    code, report, _ = verify(project)
    assert code == 1, report
    result = checks(report)["step"]
    assert (result["verdict"], result["failure"]) == ("fail", "immediate"), result
    assert re.fullmatch(
        r"step \d+ unchanged, nothing printed and no checkpoint written for [\d.]+ s "
        r"\(hang_after 2 s\)",
        result["observed"],
    ), result["observed"]
    # hang at 4 s, called 2 s later at the next poll: the 60 s of stall_after play no part.
    assert report["timings"]["duration"] < 4 + 2 + INTERVAL + SLACK, report["timings"]
    project.kill_session(VMID, "hang")


def test_a_long_silent_checkpoint_save_is_not_a_hang(project: Project) -> None:
    """A save that prints nothing for 5 s but writes its file as it goes keeps the run alive
    for hang_after 2. While it saves, the step does not move: those polls are not passing (the
    run is not progressing now) but never failing; after it, 8 passing polls in a row pass."""
    env = {"DEMO_CHECKPOINT_EVERY": "6", "DEMO_SAVE_SECONDS": "5"}
    step = {"stall_after": 60, "hang_after": 2}
    deploy(project, "save", env=env, verify={"step": step, "successes": 8, "window": 45})
    code, report, _ = verify(project)
    assert code == 0, report["reason"]
    # The save (from step 6, ~3 s in, for 5 s) came before the last of the passing polls.
    assert report["timings"]["duration"] > WAIT + 7
    assert "step_6.pt" in project.ct_text(VMID, "ls", "/root/save/checkpoints")
    project.kill_session(VMID, "save")


def test_run_replaced_while_verify_polls(project: Project) -> None:
    deploy(project, "replaced")
    argv = project.argv("verify", "--json")
    with subprocess.Popen(
        [*argv, "--successes", "50"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as running:
        # Its first poll pins the run it judges (one progress line per poll off a terminal):
        # the redeploy comes after it, however long this process took to start.
        assert running.stderr is not None
        first = running.stderr.readline()
        assert "s warmup" in first or "judging" in first, first
        redeploy = project.launcher("deploy", "--restart")
        assert redeploy.returncode == 0, redeploy.stderr
        out, err = running.communicate(timeout=60)
        err = first + err
    assert running.returncode == 1, out + err
    report = json.loads(out)
    jsonschema.validate(report, SCHEMA)
    old = report["run"]
    assert old and old.startswith("replaced:")
    new = re.fullmatch(r"run replaced by (replaced:\S+)", report["reason"])
    assert new is not None, report["reason"]
    assert new[1] != old
    assert checks(report)["run"]["verdict"] == "fail"
    project.kill_session(VMID, "replaced")
